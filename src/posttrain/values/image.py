"""Images as message content: `Image` (bytes, MIME type, SHA-256), and the parts of a message.

Inside posttrain an image is its bytes plus their SHA-256 and MIME type; the hash is its identity
everywhere (the store keeps one row per hash, a prefix-cache key includes it, a replay compares
it). On the wire (OpenAI-compatible chat) it becomes an `image_url` part with a base64 data URI.

A message's content is either a plain `str` (every text-only caller) or a tuple of parts
(`TextPart`, `ImagePart`) in reading order. `content_text` gives the text of either, so code that
only reads text keeps working; `content_images` gives the images.

Only PNG and JPEG are accepted: what the renderers here produce and what image-text models'
processors read. The bytes are checked against the declared type (a mislabelled image is a bug
at its source, caught there rather than by a processor far away).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any

MIME_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
MAX_IMAGE_BYTES = 8 * 1024 * 1024
"""an image larger than this is refused (a renderer gone wrong, not an observation)"""


@dataclass(frozen=True)
class Image:
    data: bytes = field(repr=False)
    mime: str = "image/png"
    sha256: str = field(default="", compare=False)
    """hex SHA-256 of `data` (computed; a given value must match)"""

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(f"Image.data must be bytes, got {type(self.data).__name__}")
        if self.mime not in MIME_MAGIC:
            raise ValueError(f"Image.mime must be one of {sorted(MIME_MAGIC)}, got {self.mime!r}")
        if not self.data.startswith(MIME_MAGIC[self.mime]):
            raise ValueError(f"Image.data is not a {self.mime} image (its first bytes are {self.data[:8]!r})")
        if len(self.data) > MAX_IMAGE_BYTES:
            raise ValueError(f"Image.data has {len(self.data)} bytes, more than {MAX_IMAGE_BYTES}")
        digest = hashlib.sha256(self.data).hexdigest()
        if self.sha256 and self.sha256 != digest:
            raise ValueError(f"Image.sha256 {self.sha256} does not match its data ({digest})")
        object.__setattr__(self, "sha256", digest)

    def data_uri(self) -> str:
        return f"data:{self.mime};base64," + base64.b64encode(self.data).decode("ascii")

    @classmethod
    def from_data_uri(cls, uri: str) -> Image:
        head, sep, payload = uri.partition(",")
        if not (sep and head.startswith("data:") and head.endswith(";base64")):
            raise ValueError(f"not a base64 data URI: {uri[:40]!r}")
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as e:
            raise ValueError(f"data URI payload is not base64: {e}") from e
        return cls(data, head[len("data:"):-len(";base64")])

    def ref(self) -> dict[str, Any]:
        """What a trajectory records of the image (the bytes live in the store, once per hash)."""
        return {"sha256": self.sha256, "mime": self.mime, "bytes": len(self.data)}


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    image: Image
    alt: str = ""
    """what the image shows, in words; a text-only rendering uses it (never the grader's data)"""


Part = TextPart | ImagePart
Content = str | tuple[Part, ...]


def parts(text: str, images: tuple[Image, ...] | list[Image] = (), alts: tuple[str, ...] = ()) -> Content:
    """Content of a message: `text` alone (a plain str) or `text` followed by `images`."""
    if not images:
        return text
    alts = tuple(alts) + ("",) * (len(images) - len(alts))
    return (TextPart(text), *(ImagePart(img, alt) for img, alt in zip(images, alts)))


def content_text(content: Content, image_placeholder: str | None = None) -> str:
    """The text of a message's content. Images are left out, or written as `image_placeholder`
    (formatted with `alt` and `sha256`) where they stand."""
    if isinstance(content, str):
        return content
    out = []
    for p in content:
        if isinstance(p, TextPart):
            out.append(p.text)
        elif image_placeholder is not None:
            out.append(image_placeholder.format(alt=p.alt, sha256=p.image.sha256))
    return "\n".join(out)


def content_images(content: Content) -> tuple[Image, ...]:
    if isinstance(content, str):
        return ()
    return tuple(p.image for p in content if isinstance(p, ImagePart))


def to_openai(content: Content) -> str | list[dict[str, Any]]:
    """OpenAI chat content: a str stays a str; parts become text and `image_url` parts."""
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": p.text} if isinstance(p, TextPart)
            else {"type": "image_url", "image_url": {"url": p.image.data_uri()}} for p in content]


def from_openai(content: Any) -> Content:
    """The inverse of `to_openai` (a server reading a chat request); bad input raises ValueError
    naming the part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError("message content must be a string or a non-empty list of parts")
    out: list[Part] = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "text" and isinstance(p.get("text"), str):
            out.append(TextPart(p["text"]))
        elif kind == "image_url" and isinstance(p.get("image_url"), dict):
            try:
                out.append(ImagePart(Image.from_data_uri(str(p["image_url"].get("url", "")))))
            except ValueError as e:
                raise ValueError(f"content part {i} (image_url): {e}") from e
        else:
            raise ValueError(f"content part {i}: expected {{'type': 'text', 'text': ...}} or "
                             f"{{'type': 'image_url', 'image_url': {{'url': 'data:...'}}}}, got {str(p)[:80]}")
    return tuple(out)
