"""Real images installed on this machine, derived near-duplicates with known ground truth, and corrupt files.

Sources (only files that ship inside installed packages; nothing is downloaded):

- scikit-image's bundled ``skimage/data`` images (the ones inside the wheel, not its pooch cache), whole and
  cut into non-overlapping tiles (different parts of a photo are different images);
- matplotlib's ``sample_data`` pictures and toolbar icons;
- the Adwaita icon theme (``/usr/share/icons/Adwaita``, Debian package ``adwaita-icon-theme``): one picture
  per icon name, the largest raster size, flattened on white;
- ``/usr/share/pixmaps`` and other Debian package pictures when present.

Originals that are pixel-identical after flattening (one icon under two names) are kept once. The
near-duplicates of an original are the transformations trainers meet in web crawls: resized, re-encoded at
another JPEG quality or as WebP, slightly cropped; an original with its variants is one ground-truth group.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

TILE = 256  # tile side of the photo tiles (px)
MAX_SIDE = 1024  # originals are shrunk to at most this side (web crawls: mostly 256-1024 px)
ICON_ROOTS = (Path("/usr/share/icons/Adwaita"), Path("/usr/share/icons/hicolor"), Path("/usr/share/pixmaps"))
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".tif", ".tiff", ".webp", ".bmp")


@dataclass(frozen=True)
class Original:
    name: str  # stable id, e.g. "skimage/astronaut" or "adwaita/battery-full-symbolic"
    caption: str
    image: Image.Image  # RGB


@dataclass(frozen=True)
class CorpusImage:
    key: str  # file stem, unique
    data: bytes  # the encoded file
    extension: str  # "jpg" | "png" | "webp" | ...
    caption: str
    group: str | None  # the original's name: images of one group are near-duplicates of each other
    transform: str  # "original", "resize:0.62", "jpeg:55", "crop:0.04", ... or the corruption
    expected_reason: str | None = None  # for corrupt files: the quarantine reason the media checks give


def _flatten(image: Image.Image) -> Image.Image:
    """RGB on white (how a viewer shows a transparent icon)."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _shrink(image: Image.Image, max_side: int = MAX_SIDE) -> Image.Image:
    if max(image.size) <= max_side:
        return image
    scale = max_side / max(image.size)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.LANCZOS)


def _skimage_dir() -> Path | None:
    try:
        import skimage
    except ImportError:
        return None
    path = Path(skimage.__file__).parent / "data"
    return path if path.is_dir() else None


def _matplotlib_dirs() -> list[Path]:
    try:
        import matplotlib
    except ImportError:
        return []
    root = Path(matplotlib.__file__).parent / "mpl-data"
    return [root / "sample_data", root / "images"]


# Files that are another file of the same source in disguise (same picture, other colour layout or viewpoint).
_SKIP = {"chessboard_RGB", "motorcycle_right", "multipage", "multipage_rgb", "no_time_for_that_tiny"}


def _open(path: Path) -> Image.Image | None:
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except Exception:  # not a picture Pillow reads (an SVG named .png, a damaged file): not a source
        return None


def photo_originals(*, tiles: bool = True) -> Iterator[Original]:
    """scikit-image's and matplotlib's bundled pictures, whole, and (``tiles``) cut into ``TILE`` px tiles."""
    sources: list[tuple[str, Path]] = []
    sk = _skimage_dir()
    if sk is not None:
        sources += [("skimage", p) for p in sorted(sk.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
    for folder in _matplotlib_dirs():
        if folder.name == "sample_data" and folder.is_dir():
            sources += [("matplotlib", p) for p in sorted(folder.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
    for source, path in sources:
        if path.stem in _SKIP:
            continue
        image = _open(path)
        if image is None or min(image.size) < 16:
            continue
        flat = _flatten(image)
        label = path.stem.replace("_", " ")
        yield Original(f"{source}/{path.stem}", f"{label}, a picture from {source}'s sample data", _shrink(flat))
        if not tiles:
            continue
        for top in range(0, flat.height - TILE + 1, TILE):
            for left in range(0, flat.width - TILE + 1, TILE):
                tile = flat.crop((left, top, left + TILE, top + TILE))
                lo, hi = tile.convert("L").getextrema()
                if hi - lo < 24:  # a flat tile (sky, background): no picture to tell apart
                    continue
                yield Original(f"{source}/{path.stem}@{left},{top}", f"detail of {label} at ({left}, {top})", tile)


def icon_originals() -> Iterator[Original]:
    """One picture per icon name (its largest raster), flattened on white, from the icon themes on this machine."""
    best: dict[str, tuple[int, Path]] = {}
    for root in ICON_ROOTS:
        if not root.is_dir():
            continue
        for folder, _, files in os.walk(root):
            for file in files:
                path = Path(folder) / file
                if path.suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                name = f"{root.name}/{file.split('.')[0]}"
                size = path.stat().st_size
                if name not in best or size > best[name][0]:
                    best[name] = (size, path)
    for name in sorted(best):
        image = _open(best[name][1])
        if image is None or min(image.size) < 16:
            continue
        label = name.split("/", 1)[1].replace("-", " ").replace("_", " ")
        yield Original(f"icon:{name}", f"{label} icon", _shrink(_flatten(image)))


def originals(sources: str = "photos") -> list[Original]:
    """Every original once, pixel-identical pictures kept once (first by name).

    ``sources``: ``photos`` (photographs and their tiles), ``icons`` (icon themes) or ``all``. Symbolic icons
    (a grey glyph on white) are a hard case for perceptual hashes: the low frequencies of a mostly white square
    carry little signal, so re-encoding flips bits and different glyphs of one family hash alike.
    """
    if sources not in ("photos", "icons", "all"):
        raise ValueError(f"sources must be photos, icons or all, got {sources!r}")
    chosen = [*(photo_originals() if sources != "icons" else ()), *(icon_originals() if sources != "photos" else ())]
    seen: set[str] = set()
    out: list[Original] = []
    for original in chosen:
        digest = hashlib.sha256(original.image.tobytes() + repr(original.image.size).encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        out.append(original)
    return out


def encode(image: Image.Image, extension: str, *, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    if extension in ("jpg", "jpeg"):
        image.convert("RGB").save(buffer, "JPEG", quality=quality)
    elif extension == "webp":
        image.save(buffer, "WEBP", quality=quality)
    else:
        image.save(buffer, extension.upper())
    return buffer.getvalue()


def derive(image: Image.Image, rng: random.Random, extension: str) -> tuple[Image.Image, str, str, int]:
    """One near-duplicate of ``image`` (stored as ``extension``): (picture, extension, transform label, quality).

    Resized and cropped copies keep the original's format; re-encodes change it."""
    kind = rng.choice(("resize", "jpeg", "crop", "webp", "resize+jpeg"))
    if kind == "resize":
        scale = rng.uniform(0.5, 0.85)
        size = (max(8, round(image.width * scale)), max(8, round(image.height * scale)))
        return image.resize(size, Image.Resampling.BILINEAR), extension, f"resize:{scale:.2f}", 85
    if kind == "jpeg":
        quality = rng.randint(35, 80)
        return image, "jpg", f"jpeg:{quality}", quality
    if kind == "crop":
        fraction = rng.uniform(0.02, 0.05)  # per side
        dx, dy = round(image.width * fraction), round(image.height * fraction)
        return image.crop((dx, dy, image.width - dx, image.height - dy)), extension, f"crop:{fraction:.3f}", 85
    if kind == "webp":
        quality = rng.randint(50, 85)
        return image, "webp", f"webp:{quality}", quality
    scale = rng.uniform(0.6, 0.9)
    quality = rng.randint(50, 85)
    size = (max(8, round(image.width * scale)), max(8, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS), "jpg", f"resize:{scale:.2f}+jpeg:{quality}", quality


def near_duplicate_corpus(target: int = 2000, *, seed: int = 0, max_variants: int = 20,
                          sources: list[Original] | None = None) -> list[CorpusImage]:
    """At least ``target`` images (as far as ``max_variants`` copies of each original allow): every original once,
    and 0..``max_variants`` derived copies of each, drawn around the mean the target needs. Deterministic for a seed.
    """
    rng = random.Random(seed)
    pool = sources if sources is not None else originals("photos")
    if not pool:
        raise RuntimeError("no source images found: install scikit-image (pip install scikit-image) or an icon theme")
    needed = max(0, target - len(pool))
    mean = -(-needed // len(pool))  # variants an original gets on average
    counts = [rng.randint(0, min(max_variants, 2 * mean)) if mean else 0 for _ in pool]
    i = 0
    while sum(counts) < needed and any(c < max_variants for c in counts):  # top up to reach the target
        if counts[i % len(pool)] < max_variants:
            counts[i % len(pool)] += 1
        i += 1
    out: list[CorpusImage] = []
    for index, (original, count) in enumerate(zip(pool, counts)):
        key = f"img{index:05d}"
        photo = original.name.startswith(("skimage", "matplotlib"))
        extension = "jpg" if photo else "png"
        out.append(CorpusImage(key, encode(original.image, extension, quality=92), extension, original.caption,
                               original.name, "original"))
        for v in range(count):
            picture, ext, label, quality = derive(original.image, rng, extension)
            out.append(CorpusImage(f"{key}v{v:02d}", encode(picture, ext, quality=quality), ext, original.caption,
                                   original.name, label))
    return out


def corrupt_images(good: bytes) -> list[CorpusImage]:
    """Broken files, each with the quarantine reason the media checks give (``operators.media.decode``)."""
    bomb = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(bomb, "PNG", optimize=True)  # 144 Mpx of zeros in a few kB
    return [
        CorpusImage("bad-truncated", good[: len(good) // 2], "jpg", "a truncated JPEG", None, "truncated", "undecodable_image"),
        CorpusImage("bad-magic", b"<html>not an image</html>\n" * 8, "jpg", "an HTML page named .jpg", None, "wrong magic",
                    "unknown_image_format"),
        CorpusImage("bad-empty", b"", "png", "a zero-byte file", None, "empty", "empty_image"),
        CorpusImage("bad-bomb", bomb.getvalue(), "png", "a decompression bomb", None, "12000x12000 px",
                    "decompression_bomb"),
    ]
