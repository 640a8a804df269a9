"""Option records and the command line's flags: a flag's default is read from its record's field, and a value the
record's constraints refuse is one line naming the flag and what it takes (`options`)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kernelbot import KernelbotError

M = TypeVar("M", bound=BaseModel)
# pydantic's constraint errors → what the flag takes
_TAKES = {"greater_than": lambda c: "positive" if c["gt"] == 0 else f"greater than {c['gt']}",
          "greater_than_equal": lambda c: f"at least {c['ge']}" if c["ge"] != 0 else "0 or more",
          "less_than": lambda c: f"below {c['lt']}", "less_than_equal": lambda c: f"at most {c['le']}"}


def flag_of(record: type[BaseModel], field: str) -> str:
    """The flag that sets `field`: its `flag` in json_schema_extra, else --the-field-name."""
    extra = record.model_fields[field].json_schema_extra
    given = extra.get("flag") if isinstance(extra, dict) else None
    return str(given) if given else "--" + field.replace("_", "-")


def default(record: type[BaseModel], field: str) -> Any:
    """The field's default, for the flag's default (one place for both)."""
    return record.model_fields[field].get_default(call_default_factory=True)


def options(record: type[M], /, **values: Any) -> M:
    """The record from the flags' values, or a KernelbotError naming the first flag whose value it refuses."""
    try:
        return record(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = flag_of(record, field) if field in record.model_fields else field
        takes = _TAKES.get(err["type"])
        if takes is not None:
            raise KernelbotError(f"{flag} must be {takes(err['ctx'])}, got {err['input']}") from None
        if err["type"] == "value_error":  # a validator's own line, which names its flag (and hides what must be)
            raise KernelbotError(err["msg"].removeprefix("Value error, ")) from None
        raise KernelbotError(f"{flag}: {err['msg']} (got {err['input']!r})") from None
