"""Images as message content: the `Image` value, parts, the OpenAI wire form, the store."""

from __future__ import annotations

import hashlib

import pytest

from posttrain.storage.store import Store
from posttrain.tasks.families.pictures import figure, png
from posttrain.values.generation import Message
from posttrain.values.image import (
    Image,
    ImagePart,
    TextPart,
    content_images,
    content_text,
    from_openai,
    parts,
    to_openai,
)
from posttrain.values.trajectory import Trajectory, Turn
from posttrain.values.verdict import Verdict


def _png(label: str) -> Image:
    with figure(64, 48) as fig:
        fig.text(0.1, 0.5, label)
        return png(fig)


def test_image_hash_type_and_data_uri_round_trip():
    img = _png("a")
    assert img.sha256 == hashlib.sha256(img.data).hexdigest()
    assert Image.from_data_uri(img.data_uri()) == img
    with pytest.raises(ValueError, match="not a image/jpeg"):
        Image(img.data, "image/jpeg")
    with pytest.raises(ValueError, match="does not match"):
        Image(img.data, "image/png", "0" * 64)
    with pytest.raises(ValueError, match="mime"):
        Image(img.data, "image/gif")
    with pytest.raises(ValueError, match="not a base64 data URI"):
        Image.from_data_uri("http://example.com/x.png")


def test_same_drawing_gives_identical_bytes_and_different_drawing_differs():
    assert _png("chart").data == _png("chart").data
    assert _png("chart").sha256 != _png("chart2").sha256
    assert b"Software" not in _png("chart").data  # no matplotlib version tag in the file


def test_message_content_stays_text_for_text_callers():
    assert Message("user", "hi").text == "hi" and Message("user", "hi").images == ()
    img = _png("b")
    assert parts("look", ()) == "look"  # no images: a plain str, as before
    m = Message("user", parts("look", [img]))
    assert m.text == "look" and m.images == (img,)
    assert content_text(m.content, "[image {sha256}]") == f"look\n[image {img.sha256}]"
    assert content_images("plain") == ()


def test_openai_wire_form_round_trips():
    img = _png("c")
    content = (TextPart("what is drawn?"), ImagePart(img))
    wire = to_openai(content)
    assert wire == [{"type": "text", "text": "what is drawn?"},
                    {"type": "image_url", "image_url": {"url": img.data_uri()}}]
    assert wire[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert from_openai(wire) == content
    assert to_openai("text") == "text"
    with pytest.raises(ValueError, match="content part 0"):
        from_openai([{"type": "audio"}])


def _traj(images: list[Image], tid: str) -> Trajectory:
    turn = Turn(index=0, observation="q", action="a", observation_images=[i.ref() for i in images])
    return Trajectory(task_key="k", task_hash="h", domain="d.x", split="train", policy_version="p",
                      status="completed", turns=[turn], verdict=Verdict(True, 1.0), reward=1.0,
                      images={i.sha256: i for i in images}, id=tid)


def test_store_keeps_each_image_once_and_gives_it_back(tmp_path):
    a, b = _png("one"), _png("two")
    store = Store(tmp_path / "s.sqlite")
    store.put_trajectories([(_traj([a, b], "t1"), None, None), (_traj([a], "t2"), None, None)])
    stats = store.image_stats()
    assert stats == {"images": 2, "bytes": len(a.data) + len(b.data), "refs": 3}
    back = store.get_trajectory("t1")
    assert back.images == {a.sha256: a, b.sha256: b}
    assert back.turns[0].observation_images[0]["sha256"] == a.sha256
    assert "images" not in back.to_dict()  # refs in the record, bytes in the image table
    with pytest.raises(KeyError, match="no image"):
        store.get_image("f" * 64)
