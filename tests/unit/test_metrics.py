import json

import pytest

import tutorial_lib as tl
from tutorial_lib.errors import MetricsError
from tutorial_lib.runs.metrics import JsonlTail


def write_rank(folder, rank, steps):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank{rank}.jsonl", "w") as f:
        for step in steps:
            f.write(json.dumps({"step": step, "rank": rank, "loss_local": 1.0 / step + rank,
                                "loss_global": 1.0 / step + 0.5}) + "\n")


def test_read_metrics_joins_ranks_sorted_by_rank_and_step(tmp_path):
    write_rank(tmp_path / "metrics", 1, [2, 1])
    write_rank(tmp_path / "metrics", 0, [1, 2, 3])
    df = tl.runs.read_metrics(tmp_path, ranks=2)
    assert list(zip(df["rank"], df["step"])) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert df.loc[3, "loss_local"] == 2.0
    assert len(tl.runs.read_metrics(tmp_path / "metrics")) == 5, "the metrics folder itself is accepted too"


def test_missing_folder_rank_or_lines_are_named(tmp_path):
    with pytest.raises(MetricsError, match="no metrics folder"):
        tl.runs.read_metrics(tmp_path)
    write_rank(tmp_path / "metrics", 0, [1])
    with pytest.raises(MetricsError, match=r"missing metrics file\(s\) \['rank1.jsonl'\]"):
        tl.runs.read_metrics(tmp_path, ranks=2)
    (tmp_path / "metrics" / "rank0.jsonl").write_text("")
    with pytest.raises(MetricsError, match="no metrics lines"):
        tl.runs.read_metrics(tmp_path)


def test_a_corrupt_line_is_reported_with_file_and_line_number(tmp_path):
    write_rank(tmp_path / "metrics", 0, [1])
    with open(tmp_path / "metrics" / "rank0.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(MetricsError, match=r"rank0.jsonl:2 is not a JSON line"):
        tl.runs.read_metrics(tmp_path)


def test_tail_returns_only_complete_new_lines(tmp_path):
    tail = JsonlTail(tmp_path, "rank*.jsonl")
    assert tail.read_new() == []
    path = tmp_path / "rank0.jsonl"
    path.write_text('{"step": 1}\n{"step": 2')
    assert tail.read_new() == [{"step": 1}]
    with open(path, "a") as f:
        f.write('}\n{"step": 3}\n')
    assert tail.read_new() == [{"step": 2}, {"step": 3}]
    assert tail.read_new() == []


def test_memory_samples_and_collectives(tmp_path):
    with pytest.raises(MetricsError, match="no memory samples"):
        tl.runs.read_memory_samples(tmp_path)
    with pytest.raises(MetricsError, match="kind must be"):
        tl.runs.read_memory_samples(tmp_path, "disk")
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "rss.jsonl").write_text('{"time_s": 0.2, "rank": 0, "pid": 5, "rss_bytes": 100}\n')
    assert tl.runs.read_memory_samples(tmp_path)["rss_bytes"].tolist() == [100]
    with pytest.raises(MetricsError, match="did the script run to the end"):
        tl.runs.read_collectives(tmp_path)
    (tmp_path / "metrics").mkdir()
    for r in (1, 0):
        (tmp_path / "metrics" / f"collectives_rank{r}.json").write_text(json.dumps({"rank": r}))
    assert [r["rank"] for r in tl.runs.read_collectives(tmp_path)] == [0, 1]
