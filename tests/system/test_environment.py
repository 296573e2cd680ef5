"""The image record in run.json and doctor: present inside an image, absent outside, an unreadable
one reported as such instead of dropped (the run did happen inside some image)."""

from __future__ import annotations

import json

from gpt2dist.config import machine
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



def test_run_json_records_the_cpus_bf16_support():
    assert environment.devices()["cpu_bf16"] == machine.cpu_bf16() in {"native", "emulated", "unknown"}
