"""Build the bundled image-text demo set (``jobs/image-demo.yaml``) from real pictures on this machine.

    python -m data.images.generate        # rewrites data/images/demo-*.tar, pairs.parquet, refs.jsonl, files/

Three inputs, one per reader of kind ``image_text``:

- ``demo-00000.tar``: a WebDataset shard in img2dataset's layout (``KEY.jpg|png|webp`` + ``KEY.txt`` + ``KEY.json``):
  originals, near-duplicates derived from them (``transform`` in the JSON says which), and corrupt files;
- ``pairs.parquet``: caption + image bytes columns (a few repeat pictures of the shard);
- ``refs.jsonl`` + ``files/``: caption + a relative image path (one path points at nothing).

``truth.json`` lists the ground truth: each key's group (its original) and the reason expected for bad ones.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data.images.corpus import CorpusImage, corrupt_images, icon_originals, near_duplicate_corpus, photo_originals

HERE = Path(__file__).parent
DEMO_SIDE = 192  # keep the bundled files small (the whole set stays well under 1 MB)
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "coins", "moon", "horse", "hubble_deep_field",
          "retina", "grace_hopper", "immunohistochemistry", "ihc", "brick", "motorcycle_left", "page")
ICONS = ("battery-full-symbolic", "weather-storm-symbolic", "face-smile-symbolic", "computer-symbolic", "debian-logo")


def demo_sources() -> list:
    from data.images.corpus import Original, _shrink

    picked: list[Original] = []
    for original in photo_originals(tiles=False):
        if original.name.split("/", 1)[1] in PHOTOS:
            picked.append(Original(original.name, original.caption, _shrink(original.image, DEMO_SIDE)))
    for original in icon_originals():
        if original.name.split("/", 1)[1] in ICONS:
            picked.append(Original(original.name, original.caption, _shrink(original.image, DEMO_SIDE)))
    return picked


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o644, "", ""
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, images: list[CorpusImage]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for image in images:
            _tar_add(tar, f"{image.key}.{image.extension}", image.data)
            _tar_add(tar, f"{image.key}.txt", image.caption.encode("utf-8"))
            meta = {"group": image.group, "transform": image.transform}
            _tar_add(tar, f"{image.key}.json", json.dumps(meta, sort_keys=True).encode())


def main(out: Path = HERE) -> dict[str, dict[str, str | None]]:
    sources = demo_sources()
    photos = [s for s in sources if not s.name.startswith("icon:")]
    icons = [s for s in sources if s.name.startswith("icon:")]  # no variants: pHash is weak on glyphs (corpus.py)
    images = near_duplicate_corpus(2 * len(photos), seed=17, max_variants=2, sources=photos)
    images += [CorpusImage(f"icon{i:03d}", image.data, image.extension, image.caption, image.group, image.transform)
               for i, image in enumerate(near_duplicate_corpus(0, max_variants=0, sources=icons))]
    bad = corrupt_images(images[0].data)
    write_shard(out / "demo-00000.tar", images + bad)
    truth: dict[str, dict[str, str | None]] = {
        i.key: {"group": i.group, "transform": i.transform, "reason": i.expected_reason} for i in images + bad}
    # Parquet with image bytes: three pictures again under new keys (exact copies of shard samples) and two new.
    extra = near_duplicate_corpus(0, seed=5, max_variants=0, sources=sources[-2:])
    rows = [images[0], images[3], images[5]] + extra
    pq.write_table(pa.table({"caption": [r.caption for r in rows], "image": pa.array([r.data for r in rows], pa.binary()),
                             "key": [f"pq-{r.key}" for r in rows]}), out / "pairs.parquet", compression="zstd")
    for r in rows:
        truth[f"pq-{r.key}"] = {"group": r.group, "transform": r.transform, "reason": None}
    # JSONL with relative paths.
    files = out / "files"
    files.mkdir(exist_ok=True)
    lines = []
    for r in images[1:4]:
        name = f"{r.key}.{r.extension}"
        (files / name).write_bytes(r.data)
        lines.append({"caption": r.caption, "image_path": f"files/{name}", "key": f"ref-{r.key}"})
        truth[f"ref-{r.key}"] = {"group": r.group, "transform": r.transform, "reason": None}
    lines.append({"caption": "a picture that is not there", "image_path": "files/missing.jpg", "key": "ref-missing"})
    truth["ref-missing"] = {"group": None, "transform": "missing", "reason": "image_not_found"}
    (out / "refs.jsonl").write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    return truth


if __name__ == "__main__":
    truth = main()
    print(f"{len(truth)} records: {sum(1 for t in truth.values() if t['reason'])} bad, "
          f"{len({t['group'] for t in truth.values() if t['group']})} pictures")
