"""The report's image section for tables holding ``image_text`` samples: resolution and aspect-ratio histograms,
a contact sheet (grid PNG) of kept images and one of the keepers of the largest duplicate clusters.

``media_plots(lake, out_dir=...)`` returns ``{name: png path}`` (empty for a table without images), so the HTML
report can add a section per entry. Widths and heights are streamed in batches; only the few images shown on a
contact sheet are read. Pillow and matplotlib are imported when drawn.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from datahub.kinds.media import IMAGE, IMAGE_HEIGHT, IMAGE_WIDTH
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches

BATCH_ROWS = 65_536
LINEAGE_BATCH_ROWS = 16_384  # rows of the lineage scan for dropped clusters (a JSON ref each): ~5 MB a batch
SHEET_IMAGES = 48  # kept images on the contact sheet
SHEET_CLUSTERS = 24  # keepers of the largest duplicate clusters


def contact_sheet(images: Sequence[bytes | None], labels: Sequence[str] = (), *, columns: int = 8, cell: int = 128) -> bytes:
    """A grid PNG of ``images`` (thumbnails fitted in ``cell`` px squares, a label under each); undecodable ones
    show as grey squares."""
    from PIL import Image, ImageDraw

    rows = max(1, -(-len(images) // columns))
    label_h = 14 if labels else 0
    sheet = Image.new("RGB", (columns * cell, rows * (cell + label_h)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, data in enumerate(images):
        x, y = (i % columns) * cell, (i // columns) * (cell + label_h)
        try:
            with Image.open(io.BytesIO(data or b"")) as opened:
                opened.draft("RGB", (cell, cell))
                thumb = opened.convert("RGB")
                thumb.thumbnail((cell - 4, cell - 4))
            sheet.paste(thumb, (x + (cell - thumb.width) // 2, y + (cell - thumb.height) // 2))
        except Exception:
            draw.rectangle((x + 2, y + 2, x + cell - 3, y + cell - 3), fill=(200, 200, 200))
        if i < len(labels):
            draw.text((x + 3, y + cell), labels[i][: cell // 6], fill=(40, 40, 40))
    out = io.BytesIO()
    sheet.save(out, "PNG", optimize=True)
    return out.getvalue()


def _histograms(widths: np.ndarray, heights: np.ndarray, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3))
    pixels = np.sqrt(widths.astype(np.float64) * heights)
    axes[0].hist(pixels, bins=40, color="#4878a8")
    axes[0].set_title(f"resolution: sqrt(w x h) px (median {np.median(pixels):.0f})", fontsize=9)
    short = np.maximum(np.minimum(widths, heights), 1)
    aspect = np.log2(widths / np.maximum(heights, 1).astype(np.float64))
    axes[1].hist(aspect, bins=40, color="#d0743c")
    axes[1].set_title("aspect ratio: log2(width / height)", fontsize=9)
    axes[2].hist(np.maximum(widths, heights) / short, bins=40, color="#6a9f58")
    axes[2].set_title("long side / short side", fontsize=9)
    for ax in axes:
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _largest_clusters(lake: Lake, run_ids: list[str], top: int) -> list[tuple[str, int]]:
    """(keeper sample_id, cluster size) of the ``top`` largest duplicate clusters dropped by these runs.

    A keeper dropped by a later operator (an exact-dedup keeper that image_dedup then drops as a near copy) is
    followed to the sample that kept it, so each cluster is counted once, under a sample still in the table. Every
    drop row is one dropped record: an exact copy has its keeper's sample_id (ref ``dup_of`` itself), so one
    sample_id may have several rows (its copies, and itself dropped as a near copy of another keeper)."""
    if not lake.exists("lineage") or not run_ids:
        return []
    dup_of: dict[str, str] = {}  # sample_id -> the other sample it was dropped as a copy of
    dropped: Counter[str] = Counter()  # sample_id -> its drop rows (records)
    # scan_batches, filtered here: the dataset scanner read ahead of this per-row loop whatever its readahead said
    lineage = lake.dataset("lineage")
    runs = pa.array(run_ids, lineage.schema.field("run_id").type)  # the scan's batches have its schema
    scanned = scan_batches(lineage, columns=["action", "run_id", "sample_id", "ref"], batch_rows=LINEAGE_BATCH_ROWS)
    batches = (batch.filter(pc.and_(pc.equal(batch.column("action"), "dropped"),
                                    pc.is_in(batch.column("run_id"), value_set=runs))) for batch in scanned)
    for batch in batches:
        for sample_id, ref in zip(batch.column("sample_id").to_pylist(), batch.column("ref").to_pylist()):
            try:
                keeper = json.loads(ref).get("dup_of") if ref else None
            except ValueError:
                keeper = None
            if keeper and sample_id:
                dropped[sample_id] += 1
                if keeper != sample_id:
                    dup_of[sample_id] = keeper

    def root(sample_id: str) -> str:
        seen = {sample_id}
        while sample_id in dup_of and dup_of[sample_id] not in seen:
            sample_id = dup_of[sample_id]
            seen.add(sample_id)
        return sample_id

    sizes: Counter[str] = Counter()  # each dropped record once, under its cluster's keeper
    for sample_id, records in dropped.items():
        sizes[root(sample_id)] += records
    return [(keeper, n + 1) for keeper, n in sizes.most_common(top)]


def _first_images(dataset: Any, count: int) -> pa.Table:
    """The first ``count`` rows with an image (sample_id, image, text), in the table's order, read ``count`` rows at a
    time: ``Dataset.head`` decoded whole row groups of images of several files ahead (100-250 MB for 48 images of a
    100 MB table)."""
    kept: list[pa.RecordBatch] = []
    found = 0
    for batch in scan_batches(dataset, columns=["sample_id", IMAGE, "text"], batch_rows=count):
        batch = batch.filter(pc.is_valid(batch.column(IMAGE)))
        kept.append(batch.slice(0, count - found))
        found += kept[-1].num_rows
        if found >= count:
            break  # the scan's generator (and its open file) ends with this function's reference to it
    return pa.Table.from_batches(kept, schema=pa.schema(dataset.schema.field(c) for c in ("sample_id", IMAGE, "text")))


def media_plots(lake: Lake, *, out_dir: str | Path, table: str = "samples", version: int | None = None) -> dict[str, Path]:
    """Write the image section's PNGs for ``table`` at ``version`` into ``out_dir``; ``{}`` without image rows."""
    out = Path(out_dir)
    if version is None:
        version = int(lake.table(table).version())
    dataset = lake.dataset(table, version)
    if IMAGE_WIDTH not in dataset.schema.names:
        return {}
    widths: list[np.ndarray] = []
    heights: list[np.ndarray] = []
    run_ids: set[str] = set()
    columns = [IMAGE_WIDTH, IMAGE_HEIGHT] + (["ingest_run_id"] if "ingest_run_id" in dataset.schema.names else [])
    for batch in dataset.to_batches(columns=columns, batch_size=BATCH_ROWS, filter=ds.field(IMAGE_WIDTH).is_valid()):
        widths.append(batch.column(IMAGE_WIDTH).to_numpy(zero_copy_only=False))
        heights.append(batch.column(IMAGE_HEIGHT).to_numpy(zero_copy_only=False))
        if "ingest_run_id" in columns:
            run_ids.update(v for v in pc.unique(batch.column("ingest_run_id")).to_pylist() if v)
    if not widths or not sum(len(w) for w in widths):
        return {}
    out.mkdir(parents=True, exist_ok=True)
    plots = {"image_sizes": _histograms(np.concatenate(widths), np.concatenate(heights), out / "image_sizes.png")}
    head = _first_images(dataset, SHEET_IMAGES)
    sheet = out / "contact_sheet.png"
    sheet.write_bytes(contact_sheet(head.column(IMAGE).to_pylist(), [t or "" for t in head.column("text").to_pylist()]))
    plots["contact_sheet"] = sheet
    clusters = _largest_clusters(lake, sorted(run_ids), SHEET_CLUSTERS)
    if clusters:
        by_id: dict[str, Any] = {}
        # scan_batches: only row groups whose sample_id statistics may hold a keeper are read, a few images a batch
        # (the dataset scanner decoded the image column of several row groups ahead)
        for batch in scan_batches(dataset, columns=["sample_id", IMAGE], batch_rows=SHEET_IMAGES,
                                  values_in=("sample_id", [k for k, _ in clusters])):
            by_id.update(zip(batch.column("sample_id").to_pylist(), batch.column(IMAGE).to_pylist()))
        shown = [(k, n) for k, n in clusters if k in by_id]
        if shown:
            path = out / "duplicate_clusters.png"
            path.write_bytes(contact_sheet([by_id[k] for k, _ in shown], [f"x{n} {k[:8]}" for k, n in shown]))
            plots["duplicate_clusters"] = path
    return plots


__all__ = ["contact_sheet", "media_plots"]
