"""Dataset files as the config names them: one path or a list, each .parquet or .jsonl."""

from __future__ import annotations

from logicrl.errors import BadInput

DATA_SUFFIXES = (".parquet", ".jsonl")


def as_paths(files) -> list[str]:
    return [files] if isinstance(files, str) else [str(p) for p in files]


def count_rows(path: str) -> int:
    """Rows in a .parquet (from its footer, without reading the data) or a .jsonl file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            if isinstance(err, FileNotFoundError):
                raise
            raise BadInput(f"{path}: cannot be read as parquet ({' '.join(str(err).split())[:200]}): "
                           "rewrite it, or point the data key at another file") from None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def dataset_rows(files) -> int:
    return sum(count_rows(p) for p in as_paths(files))


def data_sources(files) -> set[str]:
    """The data_source values in `files` (read only when a config names sources, to catch typos).

    A file or row without a readable data_source adds nothing: the dataset's own row checks name it."""
    import json

    found: set[str] = set()
    for path in as_paths(files):
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            try:
                found |= {str(v) for v in pq.read_table(path, columns=["data_source"]).column(0).to_pylist()}
            except (OSError, ValueError, KeyError):  # pyarrow's ArrowInvalid is a ValueError
                continue
        else:
            with open(path) as f:
                for line in f:
                    try:
                        row = json.loads(line) if line.strip() else None
                    except json.JSONDecodeError:
                        continue
                    if isinstance(row, dict) and row.get("data_source") is not None:
                        found.add(str(row["data_source"]))
    return found
