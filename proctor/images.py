"""Images an agent shows a vision model: the task's (`agent.run(task, images=[…])`) and tools' results.

An `ImageData` is the encoded bytes of one PNG, JPEG, GIF or WebP image with its
format, size in pixels and SHA-256. `load_image` makes one from a PIL image, a path,
raw bytes or another `ImageData`, and fails closed (`ImageError`, one line saying what
to do) on anything it will not pass on: an unreadable file, another format, more than
`MAX_IMAGE_BYTES` encoded or `MAX_IMAGE_PIXELS` pixels (checked from the header,
before any pixel is decoded). A run takes at most `MAX_IMAGES_PER_RUN` images in all.

How an image travels: the model gets it as an OpenAI-style content part
(``{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}``, the format
litellm passes to every vision provider, see `content_part`). The sandboxed program
never gets the bytes: a tool's image result reaches it as a short text handle
(`ImageData.handle`), and the image is attached to the next step's observation. Audit
records and spans hold `ImageData.describe()` — digest, byte count, width, height,
format — never the bytes.

Needs Pillow (``pip install 'proctor[images]'``), imported on first use.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import warnings
from dataclasses import dataclass, field
from typing import Any

from proctor.errors import ImageError

__all__ = [
    "FORMATS",
    "FROZEN_KEY",
    "MAX_IMAGES_PER_RUN",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "ImageData",
    "content_part",
    "freeze_images",
    "is_frozen_image",
    "is_image",
    "load_image",
]

#: Encoded size limit of one image (what vision providers accept comfortably).
MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: Pixel limit of one image (width x height), checked before decoding: no decompression bombs.
MAX_IMAGE_PIXELS = 25_000_000
#: Images one run may show its model, task images and tool results together.
MAX_IMAGES_PER_RUN = 16
#: The formats vision models take (Pillow's names).
FORMATS = ("PNG", "JPEG", "GIF", "WEBP")


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImageError("images need Pillow: pip install 'proctor[images]'") from None
    return Image


@dataclass(frozen=True, slots=True)
class ImageData:
    """One encoded image: `data` in `format` (PNG, JPEG, GIF, WEBP), `width` x `height` pixels."""

    data: bytes = field(repr=False)
    format: str
    width: int
    height: int
    sha256: str

    @property
    def mime_type(self) -> str:
        return f"image/{self.format.lower()}"

    def data_uri(self) -> str:
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode('ascii')}"

    def describe(self) -> dict[str, Any]:
        """What audit records and spans keep of the image: never its bytes."""
        return {"sha256": self.sha256, "bytes": len(self.data), "width": self.width, "height": self.height,
                "format": self.format}

    def handle(self, number: int) -> str:
        """What a sandboxed program gets instead of the image: text naming it, no bytes."""
        return (f"<image #{number}: {self.format} {self.width}x{self.height}, {len(self.data)} bytes, "
                f"sha256 {self.sha256[:12]}; shown to the model with the next observation>")

    def to_pil(self) -> Any:
        """The image as a PIL image (decoded now)."""
        return _pil().open(io.BytesIO(self.data))

    def __repr__(self) -> str:
        size = f"{self.width}x{self.height}, {len(self.data)} bytes"
        return f"ImageData({self.format} {size}, sha256 {self.sha256[:12]}…)"


def is_image(value: object) -> bool:
    """True for an `ImageData` or a PIL image (without importing Pillow)."""
    if isinstance(value, ImageData):
        return True
    module = type(value).__module__
    return module.startswith("PIL.") and any(c.__name__ == "Image" and c.__module__ == "PIL.Image"
                                             for c in type(value).__mro__)


#: The key of an image kept in a run store's journal (`freeze_images`): ``{"$image": {"format", "data"}}``.
FROZEN_KEY = "$image"


def freeze_images(value: Any, depth: int = 3) -> Any:
    """`value` with each image (as a tool returned it, up to `depth` levels into lists, tuples and dicts)
    as ``{"$image": {"format": …, "data": bytes}}``, which a run store's journal can keep; `load_image`
    reads it back. An image that cannot be loaded is left as it is (and fails to encode, saying why)."""
    if is_image(value):
        try:
            image = load_image(value)
        except ImageError:
            return value
        return {FROZEN_KEY: {"format": image.format, "data": image.data}}
    if depth <= 0:
        return value
    if isinstance(value, dict):
        return {k: freeze_images(v, depth - 1) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(freeze_images(v, depth - 1) for v in value)
    return value


def is_frozen_image(value: object) -> bool:
    """True for an image as `freeze_images` keeps it."""
    if not (isinstance(value, dict) and len(value) == 1 and FROZEN_KEY in value):
        return False
    body = value[FROZEN_KEY]
    return isinstance(body, dict) and isinstance(body.get("data"), bytes)


def content_part(image: ImageData) -> dict[str, Any]:
    """The image as a chat message content part (OpenAI's format, which litellm takes for every provider)."""
    return {"type": "image_url", "image_url": {"url": image.data_uri()}}


def _check_size(width: int, height: int, what: str) -> None:
    if width <= 0 or height <= 0:
        raise ImageError(f"{what}: the image has no pixels ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"{what}: {width}x{height} pixels is over the limit of {MAX_IMAGE_PIXELS:,} "
                         "(MAX_IMAGE_PIXELS); scale it down first")


def _check_bytes(n: int, what: str) -> None:
    if n > MAX_IMAGE_BYTES:
        raise ImageError(f"{what}: {n:,} bytes is over the limit of {MAX_IMAGE_BYTES:,} per image "
                         "(MAX_IMAGE_BYTES); scale it down or compress it first")


def _from_bytes(data: bytes, what: str) -> ImageData:
    _check_bytes(len(data), what)
    pil = _pil()
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check (far above ours) warns, then raises: both mean "too many pixels".
            warnings.simplefilter("error", pil.DecompressionBombWarning)
            with pil.open(io.BytesIO(data)) as img:  # reads the header only: size and format
                fmt = str(img.format or "").upper()
                width, height = img.size
                if fmt in FORMATS:
                    _check_size(width, height, what)
                    img.verify()  # structure and checksums, without decoding the pixels
    except ImageError:
        raise
    except (pil.DecompressionBombError, pil.DecompressionBombWarning):
        raise ImageError(f"{what}: the image has more pixels than the limit of {MAX_IMAGE_PIXELS:,} "
                         "(MAX_IMAGE_PIXELS); scale it down first") from None
    except pil.UnidentifiedImageError:
        raise ImageError(f"{what}: not a readable image (no {', '.join(FORMATS)} or other known header); "
                         "give an image file or its bytes") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a bad file
        raise ImageError(f"{what}: not a readable image ({type(exc).__name__}: {exc})") from None
    if fmt not in FORMATS:
        raise ImageError(f"{what}: {fmt or 'unknown'} images are not passed to models; use one of "
                         f"{', '.join(FORMATS)}")
    return ImageData(bytes(data), fmt, int(width), int(height), hashlib.sha256(data).hexdigest())


def _from_pil(img: Any, what: str) -> ImageData:
    width, height = img.size
    _check_size(int(width), int(height), what)
    if img.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
        img = img.convert("RGBA" if "A" in img.mode else "RGB")
    out = io.BytesIO()
    try:
        img.save(out, format="PNG")
    except Exception as exc:  # noqa: BLE001 - an image Pillow cannot write as PNG
        raise ImageError(f"{what}: cannot encode the image as PNG ({type(exc).__name__}: {exc})") from None
    data = out.getvalue()
    _check_bytes(len(data), what)
    return ImageData(data, "PNG", int(width), int(height), hashlib.sha256(data).hexdigest())


def load_image(value: Any, what: str = "image") -> ImageData:
    """`value` (an `ImageData`, a PIL image, a path, or encoded bytes) as an `ImageData`; `ImageError` if
    it cannot be one (`what` names it in the message, e.g. ``"images[2]"``)."""
    if isinstance(value, ImageData):
        _check_bytes(len(value.data), what)
        _check_size(value.width, value.height, what)
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _from_bytes(bytes(value), what)
    if is_frozen_image(value):  # journaled by a run store: checked again like any encoded image
        return _from_bytes(value[FROZEN_KEY]["data"], what)
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        try:
            # Non-blocking open: a FIFO or a device given as a path must not hang the caller; only a
            # regular file is read, and what it is is asked of the opened file (no swap after a check).
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise ImageError(f"{what}: {path} is not a regular file; give the path of an image file")
                _check_bytes(st.st_size, f"{what} ({path})")
                data = f.read(MAX_IMAGE_BYTES + 1)
        except OSError as exc:
            raise ImageError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
        return _from_bytes(data, f"{what} ({path})")
    if is_image(value):
        return _from_pil(value, what)
    raise ImageError(f"{what}: expected a PIL image, a path or bytes, got {type(value).__name__}")
