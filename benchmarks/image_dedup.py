"""Image near-duplicate dedup: accuracy against the transformation ground truth, and hashing speed vs imagehash.

Corpus (``data/images/corpus.py``, built at run time from pictures installed on this machine, nothing
downloaded): scikit-image's and matplotlib's bundled photographs, whole and cut into 256 px tiles, each with
0..20 derived copies (resized, re-encoded as JPEG or WebP at another quality, cropped 2-5 % a side, resized and
re-encoded). An original and its copies are one ground-truth group. The images are written as WebDataset
shards and run through ``image_dedup`` with its defaults as a user runs it (``run_job``, embedded Ray incl.
start-up); its lineage says which samples were dropped and whose duplicates they are.

Accuracy, per dedup decision: a dropped image is right when its ``dup_of`` is in its own group;
precision = right drops / drops, recall = right drops / (images - groups), the drops a perfect dedup makes.
Pairwise precision/recall over the clusters (every pair of images in one predicted cluster vs in one group)
is printed too.

Speed: the same bytes hashed by ``operators.media.hashing.perceptual_hashes`` with its defaults (batched:
reduced-scale JPEG decode, thread-pool decode, matrix products for the DCT) and by ``imagehash.phash`` with its
defaults called per image in a loop, in the same process, back to back in each of ``--repeat`` rounds (order
alternating); images/s are medians, the speedup is the median of the rounds' ratios.

Each size runs in a child process whose whole process tree's peak memory (PSS) is sampled
(``benchmarks/_procmem.py``); sizes default to 500 and 2000 images (4x apart).

    python benchmarks/image_dedup.py                 # last lines: f1: X and speedup_vs_imagehash: Y
    python benchmarks/image_dedup.py --sizes 2000 --sources all   # icons too (a harder case for pHash)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def write_shards(images: list, folder: Path, per_shard: int = 500) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(images), per_shard):
        with tarfile.open(folder / f"shard-{start // per_shard:05d}.tar", "w") as tar:
            for image in images[start:start + per_shard]:
                for name, data in ((f"{image.key}.{image.extension}", image.data),
                                   (f"{image.key}.txt", image.caption.encode()),
                                   (f"{image.key}.json", json.dumps({"group": image.group}).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def hashing_speed(datas: list[bytes], rounds: int) -> dict[str, Any]:
    """Our batched pHash vs ``imagehash.phash`` per image on the same bytes, back to back in each round.

    The order alternates round by round and the speedup is the median of the rounds' ratios: on a machine shared
    with other work the load moves by several times within a minute, and a ratio of two timings taken seconds
    apart is what the load affects least (best-of-N of each side, taken minutes apart, read 2.8 and 4.6 at the
    two sizes of one run)."""
    import statistics

    import numpy as np
    from PIL import Image

    import imagehash
    from operators.media.hashing import hamming, perceptual_hashes

    def ours() -> tuple[float, np.ndarray]:
        start = time.perf_counter()
        hashes, _ = perceptual_hashes(datas, "phash")
        return time.perf_counter() - start, hashes

    def peer() -> tuple[float, list]:
        start = time.perf_counter()
        hashes = [imagehash.phash(Image.open(io.BytesIO(d))) for d in datas]
        return time.perf_counter() - start, hashes

    ours_s, peer_s = [], []
    for round_ in range(rounds):
        if round_ % 2 == 0:
            (o, ours_hashes), (p, reference) = ours(), peer()
        else:
            (p, reference), (o, ours_hashes) = peer(), ours()
        ours_s.append(o)
        peer_s.append(p)
    ref = np.array([int(str(h), 16) for h in reference], dtype=np.uint64)
    distance = hamming(ours_hashes, ref)
    ratios = [p / o for o, p in zip(ours_s, peer_s)]
    return {"ours_images_s": len(datas) / statistics.median(ours_s),
            "imagehash_images_s": len(datas) / statistics.median(peer_s), "speedup": statistics.median(ratios),
            "round_speedups": ratios, "same_hash_share": float((distance == 0).mean()),
            "mean_bits_from_imagehash": float(distance.mean())}


def run_dedup(shards: Path, lake: Path, engine: str) -> tuple[float, dict[str, str], dict[str, str]]:
    """Seconds, {key: dup_of key} of dropped images and {sample_id: key} from a run of image_dedup."""
    import hashlib

    import pyarrow.compute as pc

    from datahub.kinds.media import image_text_sample_id
    from datahub.config.spec import validate_job_spec
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job

    spec = validate_job_spec({
        "name": "image-dedup-bench", "lake": {"root": str(lake)}, "engine": {"kind": engine},
        "inputs": [{"uri": str(shards / "*.tar"), "format": "webdataset", "kind": "image_text"}],
        "limits": {"max_record_bytes": 20_000_000},
        "graph": {"dedup": {"op": "image_dedup"}, "samples": {"sink": "samples", "after": ["dedup"]}},
    }, source="benchmarks/image_dedup.py")
    start = time.perf_counter()
    result = run_job(spec)
    elapsed = time.perf_counter() - start
    if result.status != "succeeded":
        raise SystemExit(f"image_dedup run failed: {result.error}")
    lake_ = Lake(lake)
    lineage = lake_.read("lineage", columns=["sample_id", "action", "ref"])
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    samples = lake_.read("samples", columns=["sample_id", "meta"])
    key_of = {sid: json.loads(meta)["key"] for sid, meta in zip(samples.column("sample_id").to_pylist(),
                                                               samples.column("meta").to_pylist())}
    # dropped samples are not in `samples`: their keys come from the shards (sample_id = caption + image hash)
    for path in sorted(shards.glob("*.tar")):
        with tarfile.open(path) as tar:
            members: dict[str, dict[str, bytes]] = defaultdict(dict)
            for info in tar:
                handle = tar.extractfile(info)
                key, ext = info.name.split(".", 1)
                members[key][ext] = handle.read() if handle else b""
        for key, m in members.items():
            image = next(v for e, v in m.items() if e in ("jpg", "png", "webp"))
            sid = image_text_sample_id(m["txt"].decode(), hashlib.sha256(image).hexdigest())
            key_of.setdefault(sid, key)
    dup_of = {key_of[sid]: key_of[json.loads(ref)["dup_of"]] for sid, ref in
              zip(dropped.column("sample_id").to_pylist(), dropped.column("ref").to_pylist())}
    return elapsed, dup_of, key_of


def scores(group_of: dict[str, str | None], dup_of: dict[str, str]) -> dict[str, float]:
    groups = defaultdict(set)
    for key, group in group_of.items():
        groups[group].add(key)
    should_drop = len(group_of) - len(groups)
    right = sum(1 for key, keeper in dup_of.items() if group_of[key] == group_of[keeper])
    precision = right / len(dup_of) if dup_of else 1.0
    recall = right / should_drop if should_drop else 1.0
    # pairwise, over predicted clusters (keeper + the images dropped as its duplicates)
    clusters: dict[str, set[str]] = defaultdict(set)
    for key, keeper in dup_of.items():
        clusters[keeper].update((key, keeper))
    predicted_pairs = sum(len(c) * (len(c) - 1) // 2 for c in clusters.values())
    right_pairs = 0
    for members in clusters.values():
        by_group: dict[str | None, int] = defaultdict(int)
        for key in members:
            by_group[group_of[key]] += 1
        right_pairs += sum(n * (n - 1) // 2 for n in by_group.values())
    true_pairs = sum(len(g) * (len(g) - 1) // 2 for g in groups.values())
    pair_p = right_pairs / predicted_pairs if predicted_pairs else 1.0
    pair_r = right_pairs / true_pairs if true_pairs else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    pair_f1 = 2 * pair_p * pair_r / (pair_p + pair_r) if pair_p + pair_r else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "pair_precision": pair_p, "pair_recall": pair_r,
            "pair_f1": pair_f1, "drops": len(dup_of), "should_drop": should_drop, "groups": len(groups)}


def one_size(size: int, sources: str, engine: str, repeat: int) -> dict[str, Any]:
    from data.images.corpus import near_duplicate_corpus, originals

    pool = originals(sources)
    full = 2000  # the pool is sized for this many images; smaller runs take a proportional share of originals
    pool = pool[: max(1, round(len(pool) * min(1.0, size / full)))]
    images = near_duplicate_corpus(size, sources=pool)
    with tempfile.TemporaryDirectory(prefix="image-dedup-") as tmp:
        shards = Path(tmp) / "shards"
        write_shards(images, shards)
        speed = hashing_speed([i.data for i in images], repeat)
        elapsed, dup_of, _ = run_dedup(shards, Path(tmp) / "lake", engine)
    group_of = {i.key: i.group for i in images}
    out = {"images": len(images), "originals": len(pool), "megabytes": sum(len(i.data) for i in images) / 1e6,
           "dedup_s": elapsed, **speed, **scores(group_of, dup_of)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="500,2000", help="comma-separated corpus sizes (images), smallest first")
    parser.add_argument("--sources", choices=["photos", "icons", "all"], default="photos")
    parser.add_argument("--engine", choices=["ray", "spark"], default="ray")
    parser.add_argument("--repeat", type=int, default=5, help="hashing timings: rounds of ours and imagehash back to "
                        "back (order alternating); the speedup is the median of the rounds' ratios")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size, JSON on stdout
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_size(args.one, args.sources, args.engine, args.repeat)))
        sys.stdout.flush()
        os._exit(0)  # delta-rs can abort at interpreter exit

    from benchmarks._procmem import run_measured

    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        measured = run_measured([sys.executable, __file__, "--one", str(size), "--sources", args.sources,
                                 "--engine", args.engine, "--repeat", str(args.repeat)], cwd=str(REPO))
        if measured.returncode != 0:
            raise SystemExit(f"size {size} failed:\n{measured.stderr[-3000:]}")
        r = json.loads(measured.stdout.strip().splitlines()[-1])
        r["peak_mb"] = measured.peak_mb
        results.append(r)
        print(f"[{r['images']} images, {r['originals']} originals, {r['megabytes']:.1f} MB] "
              f"dedup ({args.engine}, defaults): {r['dedup_s']:.1f} s, drops {r['drops']} of {r['should_drop']} "
              f"removable; precision {r['precision']:.4f} recall {r['recall']:.4f} f1 {r['f1']:.4f}; pairwise "
              f"precision {r['pair_precision']:.4f} recall {r['pair_recall']:.4f} f1 {r['pair_f1']:.4f}")
        rounds = " ".join(f"{x:.2f}" for x in r["round_speedups"])
        print(f"[{r['images']} images] pHash: datahub {r['ours_images_s']:.0f} images/s, imagehash per image "
              f"{r['imagehash_images_s']:.0f} images/s (x{r['speedup']:.2f}, median of rounds {rounds}); same hash as imagehash "
              f"{r['same_hash_share']:.3f}, mean {r['mean_bits_from_imagehash']:.2f} bits apart; "
              f"peak memory {r['peak_mb']:.0f} MB (process tree PSS)")
    small, large = results[0], results[-1]
    if len(results) > 1:
        print(f"memory_growth: {large['peak_mb'] / small['peak_mb']:.2f} (x{large['images'] / small['images']:.1f} images)")
    print(f"precision: {large['precision']:.4f}")
    print(f"recall: {large['recall']:.4f}")
    print(f"f1: {large['f1']:.4f}")
    print(f"speedup_vs_imagehash: {large['speedup']:.2f}")


if __name__ == "__main__":
    main()
