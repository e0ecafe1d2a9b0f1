"""What a job asks for: GPUs (dstack-style grammar), CPU, memory and disk.

GPU grammar, tokens joined by ':' in any order:
  vendor   nvidia | amd | apple | intel
  names    A100 or H100,A100 (comma-separated, case-insensitive)
  memory   80GB, 24GB.., 16GB..40GB (per GPU)
  count    2, 1..4, or a fraction below 1 (0.5) for a share of one GPU
Examples: `A100:80GB:2`, `H100,A100:8`, `24GB..`, `nvidia:1..4`, `T4:0.5`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuflow.specs.units import Range, format_size_mib, parse_range, parse_size_mib

VENDORS = ("nvidia", "amd", "apple", "intel")
BACKENDS = ("cuda", "rocm", "metal")
DEFAULT_BACKEND = {"nvidia": "cuda", "amd": "rocm", "apple": "metal"}


def _is_size(token: str) -> bool:
    return any(token.lower().rstrip(".").endswith(u) for u in ("gb", "mb", "tb"))


def _count(value: Any) -> float:
    number = float(value)
    if number != int(number) and not 0 < number < 1:
        raise ValueError(f"GPU count {value!r} must be a whole number, or a fraction below 1")
    return number


class GPUSpec(BaseModel):
    """GPU requirements of one node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vendor: str | None = None
    """nvidia, amd, apple or intel; None accepts any (or follows from the names)."""
    names: list[str] = Field(default_factory=list)
    """Acceptable GPU models (upper-cased); empty accepts any."""
    memory: Range | None = None
    """Memory per GPU in MiB."""
    count: Range = Field(default_factory=lambda: Range(min=1, max=1))
    """How many GPUs; a value below 1 asks for that fraction of one GPU."""
    compute_capability: str | None = None
    """Minimum CUDA compute capability, e.g. `8.0`."""

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.lower()
        if value not in VENDORS:
            raise ValueError(f"unknown GPU vendor {value!r}; allowed: {', '.join(VENDORS)}")
        return value

    @field_validator("names")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        return [name.strip().upper() for name in value if name.strip()]

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return None if value is None else parse_range(value, parse_one=parse_size_mib)

    @field_validator("count", mode="before")
    @classmethod
    def _count_range(cls, value: Any) -> Any:
        return parse_range(value, parse_one=_count)

    @model_validator(mode="after")
    def _fraction_alone(self) -> GPUSpec:
        lo, hi = self.count.min, self.count.max
        if 0 < lo < 1 and hi != lo:
            raise ValueError(f"a GPU fraction ({lo:g}) cannot be a range; write e.g. 0.5")
        if hi is not None and 0 < hi < 1 and lo != hi:
            raise ValueError(f"a GPU fraction ({hi:g}) cannot be a range; write e.g. 0.5")
        return self

    @property
    def fraction(self) -> float | None:
        """The share of one GPU asked for, or None for whole GPUs."""
        return self.count.min if 0 < self.count.min < 1 else None

    @classmethod
    def parse(cls, value: Any) -> GPUSpec:
        if isinstance(value, GPUSpec):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls(count=value)
        if isinstance(value, dict):
            data = dict(value)
            if "name" in data:
                name = data.pop("name")
                data["names"] = name if isinstance(name, list) else str(name).split(",")
            return cls.model_validate(data)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{value!r} is not a GPU spec; use e.g. A100:80GB:2 or 24GB..:1..4")
        fields: dict[str, Any] = {}
        for token in value.strip().split(":"):
            token = token.strip()
            if not token:
                raise ValueError(f"{value!r} has an empty part between ':'")
            if token.lower() in VENDORS:
                fields["vendor"] = token.lower()
            elif _is_size(token) or (".." in token and _is_size(token.replace("..", ""))):
                fields["memory"] = token
            elif token[0].isdigit() or token.startswith(".."):
                fields["count"] = token
            else:
                fields["names"] = token.split(",")
        return cls.model_validate(fields)

    def __str__(self) -> str:
        parts = []
        if self.vendor:
            parts.append(self.vendor)
        if self.names:
            parts.append(",".join(self.names))
        if self.memory:
            lo = format_size_mib(int(self.memory.min)) if self.memory.min else ""
            hi = "" if self.memory.max is None else format_size_mib(int(self.memory.max))
            parts.append(lo if self.memory.max == self.memory.min else f"{lo}..{hi}")
        parts.append(str(self.count))
        return ":".join(parts)


class ResourcesSpec(BaseModel):
    """Resources of one node. Memory and disk are in MiB, CPU in cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GPUSpec | None = None
    """None or a count of 0 means a CPU-only job."""
    cpu: Range = Field(default_factory=lambda: Range(min=1))
    memory: Range = Field(default_factory=lambda: Range(min=0))
    disk: Range = Field(default_factory=lambda: Range(min=0))
    os: str | None = None
    """linux or macos; None accepts any."""
    arch: str | None = None
    """x86_64 or arm64; None accepts any."""
    backend: str | None = None
    """cuda, rocm or metal; defaults from the GPU vendor."""
    min_driver: str | None = None
    """Minimum GPU driver version, e.g. `535.0`."""

    @property
    def gpu_label(self) -> str:
        """How messages name the GPU ask, e.g. `A100:80GB:2`, or `no GPU`."""
        return str(self.gpu) if self.gpu is not None else "no GPU"

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        if value is None or value == 0:
            return None
        return GPUSpec.parse(value)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        return parse_range(value)

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_range(value, parse_one=parse_size_mib)

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in BACKENDS:
            raise ValueError(f"unknown backend {value!r}; allowed: {', '.join(BACKENDS)}")
        return None if value is None else value.lower()

    @property
    def gpu_count(self) -> float:
        return 0 if self.gpu is None else self.gpu.count.min

    @property
    def wants_gpu(self) -> bool:
        return self.gpu is not None and (self.gpu.count.max is None or self.gpu.count.max > 0)
