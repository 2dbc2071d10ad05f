"""Attacks on images from the outside: paths that are no image files, images hidden where the program reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proctor.errors import ImageError
from proctor.images import load_image


def test_a_fifo_given_as_an_image_path_is_refused_without_blocking(tmp_path: Path) -> None:
    """A named pipe nobody writes to is refused at once as not a regular file (it used to hang the caller)."""
    fifo = tmp_path / "shot.png"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match=r"shot.png is not a regular file"):
        load_image(fifo)


def test_a_device_or_a_symlink_to_a_secret_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """/dev/zero is no regular file; a link to /etc/passwd is no image, and the error quotes none of it."""
    with pytest.raises(ImageError, match="/dev/zero is not a regular file"):
        load_image("/dev/zero")
    link = tmp_path / "cat.png"
    link.symlink_to("/etc/passwd")
    with pytest.raises(ImageError, match="not a readable image") as err:
        load_image(link)
    assert "root:x:" not in str(err.value) and "BytesIO" not in str(err.value)
