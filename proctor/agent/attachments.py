"""Images in a run: the task's, and those tools return, on their way to the model (never to the program).

`RunImages` counts a run's images against `proctor.images.MAX_IMAGES_PER_RUN` and
collects, step by step, what the model is shown next: `take` swaps an image in a tool's
result (the value itself, or an item of a list, tuple or dict) for its text handle,
which is all the sandboxed program gets, and keeps the image; `drain` hands the step's
images to the agent, which attaches them to the next observation as content parts and
records their descriptions (digest, bytes, size, format) in the step's audit record.

An image over a limit is not passed on: the program gets a handle saying why instead,
and the model never sees it (fail closed).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from proctor.errors import ImageError
from proctor.images import MAX_IMAGES_PER_RUN, ImageData, content_part, is_frozen_image, is_image, load_image

__all__ = ["RunImages", "describe_content", "with_images"]

# Containers longer than this, or nested deeper, are passed on as they are (an image in one fails to
# encode, and the program is told why).
_SCAN_LIMIT = 64
_SCAN_DEPTH = 3


def _may_hold_images(value: Any) -> bool:
    if isinstance(value, dict):
        return 0 < len(value) <= _SCAN_LIMIT
    return type(value) in (list, tuple) and 0 < len(value) <= _SCAN_LIMIT


class RunImages:
    """One run's images: counted against the limit, collected per step (see the module docstring)."""

    def __init__(self, limit: int = MAX_IMAGES_PER_RUN) -> None:
        self.limit = limit
        self.count = 0
        self._lock = threading.Lock()
        self._step: list[tuple[ImageData, dict[str, Any]]] = []
        self._task: list[dict[str, Any]] = []

    def add_task_images(self, images: Sequence[Any]) -> list[ImageData]:
        """The task's images, loaded and checked; `ImageError` (before the run starts) if one cannot be used."""
        if len(images) + self.count > self.limit:
            raise ImageError(f"images: {len(images)} given, over the limit of {self.limit} per run "
                             "(MAX_IMAGES_PER_RUN); pass fewer")
        loaded = [load_image(item, f"images[{i}]") for i, item in enumerate(images)]
        with self._lock:
            self.count += len(loaded)
            self._task.extend({"from": "task", **image.describe()} for image in loaded)
        return loaded

    def pop_task(self) -> list[dict[str, Any]]:
        """The task images' descriptions, once (the first step's audit record holds them)."""
        with self._lock:
            taken, self._task = self._task, []
        return taken

    def take(self, call_id: str, tool: str, value: Any) -> Any:
        """`value` with each image in it replaced by its handle (an `Interpreter.result_hook`)."""
        return self._walk(call_id, tool, value, _SCAN_DEPTH)

    def _walk(self, call_id: str, tool: str, value: Any, depth: int) -> Any:
        if is_image(value) or is_frozen_image(value):  # frozen: a resumed run's call answered from its journal
            return self._swap(call_id, tool, value)
        if depth <= 0 or not _may_hold_images(value):
            return value
        items = list(value.values()) if isinstance(value, dict) else list(value)
        swapped = [self._walk(call_id, tool, v, depth - 1) for v in items]
        if all(a is b for a, b in zip(swapped, items, strict=True)):
            return value  # no image in it: the very same object goes on
        if isinstance(value, dict):
            return dict(zip(value.keys(), swapped, strict=True))
        return type(value)(swapped)

    def _swap(self, call_id: str, tool: str, value: Any) -> str:
        try:
            image = load_image(value, f"the image {tool} returned")
        except ImageError as exc:
            return f"<image not shown to the model: {exc}>"
        with self._lock:
            if self.count >= self.limit:
                return (f"<image not shown to the model: this run has had {self.limit} images, the limit "
                        "(MAX_IMAGES_PER_RUN)>")
            self.count += 1
            number = self.count
            self._step.append((image, {"from": "call", "call_id": call_id, "tool": tool}))
        return image.handle(number)

    def drain(self) -> tuple[list[ImageData], list[dict[str, Any]]]:
        """The images collected since the last drain, and their descriptions for the audit record."""
        with self._lock:
            taken, self._step = self._step, []
        return [image for image, _ in taken], [{**where, **image.describe()} for image, where in taken]


def with_images(text: str, images: Sequence[ImageData]) -> str | list[dict[str, Any]]:
    """A message's content: `text` alone, or text then one content part per image."""
    if not images:
        return text
    return [{"type": "text", "text": text}, *(content_part(image) for image in images)]


def describe_content(content: Any) -> Any:
    """A message's content for a span or a token estimate: image parts become their description, no bytes."""
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            head, _, payload = url.partition(",")
            try:
                data = base64.b64decode(payload, validate=True) if head.endswith(";base64") else b""
            except ValueError:
                data = b""
            out.append({"type": "image", "mime_type": head[5:].partition(";")[0] if head.startswith("data:") else "",
                        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest() if data else None})
        else:
            out.append(part)
    return out
