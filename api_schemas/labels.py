"""What a researcher writes on an experiment to find it again: its tags and a note, set in the
spec and changed by PATCH /experiments/{id} (docs/organising.md)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

MAX_TAGS = 20
MAX_TAG_LENGTH = 40
MAX_NOTE_LENGTH = 5000
# Letters, digits and a few separators, starting with a letter or digit: a tag is typed on a
# command line and sought as an exact word in the stored list (no quote, comma or space).
TAG_CHARACTERS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+/-]*")
TAG_RULE = (
    f"1 to {MAX_TAG_LENGTH} characters: letters, digits and _ . : + / -, starting with a "
    "letter or digit"
)


def tag_problem(tag: str) -> str | None:
    """Why `tag` is not a tag (None when it is)."""
    if len(tag) > MAX_TAG_LENGTH or not TAG_CHARACTERS.fullmatch(tag):
        return f"tag {tag[: MAX_TAG_LENGTH + 10]!r} is not a tag: {TAG_RULE}"
    return None


def _tag(tag: str) -> str:
    problem = tag_problem(tag)
    if problem:
        raise ValueError(problem)
    return tag


def _distinct_tags(tags: list[str]) -> list[str]:
    repeated = sorted({t for t in tags if tags.count(t) > 1})
    if repeated:
        raise ValueError(f"tags repeat {', '.join(map(repr, repeated))}")
    return tags


def _note(note: str | None) -> str | None:
    # PostgreSQL's text refuses NUL (pydantic itself refuses lone surrogates)
    if note is not None and "\x00" in note:
        raise ValueError("the note contains NUL (U+0000)")
    return note


Tag = Annotated[str, AfterValidator(_tag)]
Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS), AfterValidator(_distinct_tags)]
Note = Annotated[str | None, Field(max_length=MAX_NOTE_LENGTH), AfterValidator(_note)]


class ExperimentLabels(BaseModel):
    """PATCH /experiments/{id}: the fields given replace the stored ones, the others stay;
    `note: null` (or "") removes the note, `tags: []` every tag. `add_tags` and `remove_tags`
    change the stored tags instead of replacing them (not with `tags`)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"tags": ["baseline", "cifar10"], "note": "lr sweep"}]},
    )

    tags: Tags | None = Field(
        None, description=f"every tag of the experiment (at most {MAX_TAGS}; each {TAG_RULE})"
    )
    add_tags: Tags | None = Field(
        None,
        description="tags to add to the stored ones (those it has already stay once); applied "
        "to the tags as stored when the edit commits, so concurrent edits all take effect",
    )
    remove_tags: Tags | None = Field(
        None, description="tags to remove from the stored ones (one it does not have is no error)"
    )
    note: Note = Field(None, description=f"free text, at most {MAX_NOTE_LENGTH} characters")

    @model_validator(mode="after")
    def _replace_or_change(self) -> ExperimentLabels:
        changes = {"add_tags", "remove_tags"} & self.model_fields_set
        if "tags" in self.model_fields_set and changes:
            raise ValueError(
                f"give tags (every tag) or {' and '.join(sorted(changes))} (a change), not both"
            )
        return self
