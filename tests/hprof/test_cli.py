"""`ddmd hprof-summary FILE [--top N] [--json]`: the table, the JSON, and bad files."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ddmd.cli.main import main
from tests.hprof.test_reader import android_dump, android_expected, standard_dump


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def run(runner: CliRunner, *args: str):
    return runner.invoke(main, ["hprof-summary", *args])


def test_table_of_an_android_dump_has_heap_columns(runner, tmp_path):
    path = tmp_path / "app.hprof"
    path.write_bytes(android_dump(4))
    result = run(runner, str(path))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{path}: JAVA PROFILE 1.0.3, 4-byte ids, 19 objects of 5 classes")
    assert "by shallow bytes" in lines[1]
    assert "heap columns count instances" in lines[1]
    columns = ["CLASS", "INSTANCES", "SHALLOW BYTES", "APP", "IMAGE", "ZYGOTE", "DEFAULT"]
    assert re.split(r"\s{2,}", lines[2]) == [*columns, "HEAP 0X51"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
    assert list(rows) == [
        "byte[]",
        "com.example.Thing",
        "com.example.Thing[]",
        "java.lang.Class",
        "java.lang.Object",
    ]
    assert rows["byte[]"] == ["5", "261", "3", "-", "2", "-", "-"]
    assert rows["java.lang.Object"] == ["4", "0", "-", "2", "-", "1", "1"]


def test_table_of_a_standard_dump_has_no_heap_columns_and_top_limits_rows(runner, tmp_path):
    path = tmp_path / "jvm.hprof"
    path.write_bytes(standard_dump(8))
    result = run(runner, str(path), "--top", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "8-byte ids" in lines[0]
    assert lines[1].startswith("top 3 by shallow bytes")
    assert re.split(r"\s{2,}", lines[2]) == ["CLASS", "INSTANCES", "SHALLOW BYTES"]
    assert [line.split()[0] for line in lines[3:]] == [
        "com.example.Node",
        "java.lang.String",
        "com.example.Node[]",
    ]
    everything = run(runner, str(path), "--top", "0")
    assert everything.output.splitlines()[1].startswith("all classes by shallow bytes")
    assert len(everything.output.splitlines()) == 3 + 14


def test_json_gives_the_same_histogram(runner, tmp_path):
    path = tmp_path / "app.hprof"
    path.write_bytes(android_dump(8))
    body = json.loads(run(runner, str(path), "--json").output)
    assert body["file"] == str(path)
    assert body["format"] == "JAVA PROFILE 1.0.3"
    assert body["sorted_by"] == "shallow_bytes"
    assert body["heaps"] == ["app", "image", "zygote", "default", "heap 0x51"]
    found = {
        row["class"]: {
            heap: (share["instances"], share["shallow_bytes"])
            for heap, share in row["heaps"].items()
        }
        for row in body["classes"]
    }
    assert found == android_expected(8)
    top2 = json.loads(run(runner, str(path), "--json", "--top", "2").output)
    assert [row["class"] for row in top2["classes"]] == [r["class"] for r in body["classes"][:2]]
    assert (top2["shown"], top2["class_count"]) == (2, 5)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the file is empty"),
        (b"PK\x03\x04 a zip file", "not an HPROF heap dump"),
        (standard_dump(4)[:-5], "the dump is truncated"),
    ],
)
def test_a_bad_file_is_one_line_and_exit_1(runner, tmp_path, content, words):
    path = tmp_path / "bad.hprof"
    path.write_bytes(content)
    result = run(runner, str(path))
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"ddmd hprof-summary: {path}: ")
    assert words in result.output


def test_a_missing_file_or_a_directory_is_one_line_and_exit_1(runner, tmp_path):
    missing = run(runner, str(tmp_path / "nope.hprof"))
    assert missing.exit_code == 1
    assert (
        missing.output
        == f"ddmd hprof-summary: cannot read {tmp_path / 'nope.hprof'}: No such file or directory\n"
    )
    folder = run(runner, str(tmp_path))
    assert folder.exit_code == 1
    assert "is a directory" in folder.output


def test_a_negative_top_is_a_usage_error(runner, tmp_path):
    path = tmp_path / "jvm.hprof"
    path.write_bytes(standard_dump(4))
    assert run(runner, str(path), "--top", "-1").exit_code == 2
