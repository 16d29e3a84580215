"""The answer must equal an independent count over the original logs."""
from pathlib import Path


def expected() -> int:
    return sum(1 for f in sorted(Path("/app/data").glob("*.log"))
               for line in f.read_text().splitlines() if len(line.split()) > 2 and line.split()[2] == "ERROR")


def test_error_count_file_exists():
    assert Path("/app/error_count.txt").is_file()


def test_error_count_is_right():
    assert Path("/app/error_count.txt").read_text().strip() == str(expected())
