"""The image record in run.json and doctor: present inside an image, absent outside, an unreadable
one reported as such instead of dropped (the run did happen inside some image)."""

from __future__ import annotations

import json

from gpt2dist.system import doctor, environment

RECORD = {"variant": "cpu", "content_id": "0123456789abcdef0123456789", "revision": "abc", "created": "2026-11-22",
          "engine": "podman", "base": {"name": "localhost/base:1", "id": "fedcba9876543210fedcba98", "digests": []}}


def test_outside_an_image_there_is_no_record(tmp_path):
    assert environment.image(tmp_path / "image.json") is None
    assert doctor._image_summary(None) == "none (not inside a gpt2dist image)"


def test_inside_an_image_its_record_is_read_and_summarised(tmp_path):
    path = tmp_path / "image.json"
    path.write_text(json.dumps(RECORD))
    assert environment.image(path) == RECORD
    assert doctor._image_summary(RECORD) == ("gpt2dist cpu image 0123456789abcdef012 on localhost/base:1 "
                                             "(fedcba9876543210fed)")


def test_an_unreadable_record_is_reported_not_dropped(tmp_path):
    path = tmp_path / "image.json"
    path.write_text('{"variant": ')
    record = environment.image(path)
    assert record["error"].startswith(f"{path} unreadable: ") and doctor._image_summary(record) == record["error"]


def test_cpu_bf16_is_native_only_with_bf16_instructions():
    """The flags line decides: AVX512-BF16 or AMX make bf16 native; AVX2 alone emulates it."""
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert environment.cpu_bf16(avx2) == "emulated"
    assert environment.cpu_bf16(avx2.replace("avx2", "avx2 avx512f avx512_bf16")) == "native"
    assert environment.cpu_bf16(avx2.replace("avx2", "avx2 amx_tile amx_bf16")) == "native"
    assert environment.cpu_bf16("processor\t: 0\nmodel name\t: some CPU\n") == "unknown"  # no flags line: say so
    assert environment.cpu_bf16() in {"native", "emulated", "unknown"}
    assert environment.devices()["cpu_bf16"] == environment.cpu_bf16()
