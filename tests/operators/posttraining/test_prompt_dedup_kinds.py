"""prompt_dedup keys the prompt per kind: an SFT chat and a DPO pair on the same prompt are different data (as their
sample_ids are), so neither is dropped as the other's duplicate, in one job or across jobs sharing a lake."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job

CHAT = {"messages": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7."}]}
PAIR = {"prompt": "Name a prime.", "chosen": "7 is prime.", "rejected": "8 is prime."}


def _job(tmp_path, name, inputs):
    for kind, records in inputs.items():
        (tmp_path / f"{name}-{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = validate_job_spec({"name": name, "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / f"{name}-{kind}.jsonl"), "kind": kind} for kind in inputs],
                              "graph": {"prompts": {"op": "prompt_dedup"},
                                        "samples": {"sink": "samples", "after": ["prompts"]}}},
                             source=str(tmp_path / f"{name}.yaml"))
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    return result


def test_a_chat_and_a_preference_pair_on_one_prompt_are_both_kept(tmp_path):
    result = _job(tmp_path, "both", {"chat": [CHAT, CHAT | {"messages": CHAT["messages"][:1] + [
        {"role": "assistant", "content": "2."}]}], "preference": [PAIR]})
    assert result.counts["dropped"] == {"duplicate_prompt": 1}  # the second chat on the prompt, not the pair
    kinds = Lake(tmp_path / "lake").read("samples", columns=["kind"]).column("kind").to_pylist()
    assert sorted(kinds) == ["chat", "preference"]


def test_a_preference_pair_is_not_a_duplicate_of_a_chat_already_in_the_lake(tmp_path):
    _job(tmp_path, "sft", {"chat": [CHAT]})
    result = _job(tmp_path, "dpo", {"preference": [PAIR]})
    assert result.counts["dropped_total"] == 0, result.counts
    samples = Lake(tmp_path / "lake").read("samples", columns=["kind"])
    assert pc.count(samples.column("kind")).as_py() == 2


def test_a_chat_prompt_indexed_by_prompt_dedup_v1_is_still_matched_after_the_upgrade(tmp_path, monkeypatch):
    """0cc922a moved prompt_dedup@2's index to a new namespace, so a prompt that @1 indexed was never matched again and
    a new input file brought its duplicates in. A chat's key is @1's (the prompt's rendering alone) and @1's
    namespace is looked up too. The first run stands in for @1: same key text for a chat, index under version 1."""
    from operators.dedup.exact import hex_digests, value_hashes
    from operators.dedup.normalize import normalize_texts
    from operators.dedup.params import ExactDedupParams
    from operators.posttraining.prompt_dedup import PromptDedup

    monkeypatch.setattr(PromptDedup, "version", "1")
    _job(tmp_path, "v1", {"chat": [CHAT]})
    monkeypatch.undo()
    lake = Lake(tmp_path / "lake")
    keys = lake.read("exact_index", columns=["content_hash"]).column("content_hash").to_pylist()
    v1_text = normalize_texts(pa.array(["<|user|>\nName a prime."]), ExactDedupParams().normalization.build())
    v1_key = hex_digests(value_hashes(v1_text))
    assert keys == v1_key.to_pylist()  # the key prompt_dedup@1 wrote for this chat
    again = {"messages": CHAT["messages"][:1] + [{"role": "assistant", "content": "11."}]}
    result = _job(tmp_path, "v2", {"chat": [again]})  # a new input file, an incremental run
    assert result.counts["dropped"] == {"duplicate_prompt": 1}, result.counts
    assert lake.read("samples", columns=["kind"]).num_rows == 1


def test_reward_model_pairs_without_a_prompt_are_not_duplicates_of_each_other(tmp_path):
    """e77b8de put ``<|preference|>`` into a pair's key text, so an empty prompt normalized to "preference" and every
    bare pair (reward-model data) shared one key: 4 of 5 were dropped. An empty prompt keeps its per-sample key; pairs
    that share a prompt are still duplicates."""
    bare = [{"chosen": f"answer {i} good", "rejected": f"answer {i} bad"} for i in range(5)]
    shared = [PAIR, PAIR | {"chosen": "11 is prime."}]
    result = _job(tmp_path, "rm", {"preference": bare + shared})
    assert result.counts["dropped"] == {"duplicate_prompt": 1}, result.counts  # the second pair on "Name a prime."
    assert Lake(tmp_path / "lake").read("samples", columns=["kind"]).num_rows == 6
