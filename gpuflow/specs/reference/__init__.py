"""Reference pages for job, fleet and profile files, generated from the spec models.

python -m gpuflow.specs.reference --write docs/reference   # regenerate the pages
python -m gpuflow.specs.reference --check docs/reference   # exit 1 when they are stale
"""

from gpuflow.specs.reference.pages import COMMAND, pages, undescribed, unexampled

__all__ = ["COMMAND", "pages", "stale", "undescribed", "unexampled"]


def stale(folder: str) -> list[str]:
    """The pages under `folder` that differ from what the models generate now."""
    from pathlib import Path

    return [
        name
        for name, text in pages().items()
        if not (Path(folder) / name).is_file() or (Path(folder) / name).read_text() != text
    ]
