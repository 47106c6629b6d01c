"""Typed params of the dedup operators (pydantic: bad values fail before any work starts)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from datahub.operator import Params
from operators.dedup.lsh import optimal_bands, recall_bands
from operators.dedup.normalize import Normalization


class NormalizationParams(Params):
    """Which normalization steps run before hashing (``operators.dedup.normalize``); all on by default."""

    unicode_nfkc: bool = True
    lowercase: bool = True
    strip_punctuation: bool = True
    collapse_whitespace: bool = True

    def build(self) -> Normalization:
        return Normalization(self.unicode_nfkc, self.lowercase, self.strip_punctuation, self.collapse_whitespace)


class DedupParams(Params):
    normalization: NormalizationParams = NormalizationParams()
    keep_by: str | None = Field(
        None, description="field of the `quality` struct; the highest value in a cluster is kept (then smallest sample_id)"
    )
    incremental: bool = Field(True, description="also dedup against samples kept by earlier runs (lake index)")


class ExactDedupParams(DedupParams):
    pass


class MinhashDedupParams(DedupParams):
    shingle: Literal["word", "char"] = "word"
    ngram: int = Field(5, ge=1, le=64, description="n-gram length: words (default 5, as datatrove) or characters")
    num_perm: int = Field(128, ge=2, le=1024)
    # Jaccard threshold for near duplicates; (bands, rows) follow from it unless given (``lsh_bands``).
    # 0.8: NeMo Curator's and datasketch's common choice.
    threshold: float = Field(0.8, gt=0, le=1)
    bands: int | None = Field(None, ge=1)
    rows: int | None = Field(None, ge=1)
    # datasketch MinHashLSH(weights=(fp, fn)): how optimal (bands, rows) trade false positives
    # (pairs below threshold becoming candidates) against false negatives (pairs above it missed).
    false_positive_weight: float = Field(0.5, ge=0, le=1)
    false_negative_weight: float = Field(0.5, ge=0, le=1)
    seed: int = Field(1, ge=0, lt=2**32)
    scheme: Literal["affine32", "affine64"] = "affine32"
    verify: bool = Field(False, description="confirm LSH candidate pairs by exact shingle Jaccard >= threshold")
    recall_target: float = Field(
        0.99, gt=0, lt=1, description="with verify (and no bands/rows/weights given): (bands, rows) whose candidate "
        "probability at the threshold is at least this, with the fewest false-positive candidates")
    max_iterations: int = Field(64, ge=1, le=1000)

    @model_validator(mode="after")
    def _bands_and_rows(self) -> MinhashDedupParams:
        if abs(self.false_positive_weight + self.false_negative_weight - 1.0) > 1e-9:
            raise ValueError(
                f"false_positive_weight + false_negative_weight must be 1, got {self.false_positive_weight} + "
                f"{self.false_negative_weight}; e.g. 0.3 and 0.7 to favour recall"
            )
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither (then they follow from threshold and num_perm)")
        if self.bands is not None and self.rows is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"bands x rows = {self.bands} x {self.rows} = {self.bands * self.rows} exceeds num_perm={self.num_perm}; "
                "lower them or raise num_perm"
            )
        return self

    def lsh_bands(self) -> tuple[int, int]:
        """``(bands, rows)``: as given; else, with ``verify``, for recall (``lsh.recall_bands``: verification
        removes the false positives, so only missed pairs cost); else balanced as datasketch's
        ``MinHashLSH._optimal_param`` (``lsh.optimal_bands`` with the two weights)."""
        if self.bands is not None and self.rows is not None:
            return self.bands, self.rows
        weights_given = {"false_positive_weight", "false_negative_weight"} & self.model_fields_set
        if self.verify and not weights_given:
            return recall_bands(self.threshold, self.num_perm, recall=self.recall_target)
        return optimal_bands(self.threshold, self.num_perm, false_positive_weight=self.false_positive_weight,
                             false_negative_weight=self.false_negative_weight)
