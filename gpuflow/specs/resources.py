"""What a job asks for: GPUs (dstack-style grammar), CPU, memory and disk.

GPU grammar, tokens joined by ':' in any order, each at most once:
  vendor   nvidia | amd | apple | intel
  names    A100 or H100,A100 (comma-separated, case-insensitive, starting with a letter)
  memory   80GB, 24GB.., 16GB..40GB (per GPU)
  count    2, 1..4, or a fraction below 1 (0.5) for a share of one GPU
Examples: `A100:80GB:2`, `H100,A100:8`, `24GB..`, `nvidia:1..4`, `T4:0.5`.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuflow.specs.units import (
    MAX_MEMORY_MIB,
    Range,
    check_text,
    format_size_mib,
    format_size_range,
    parse_count,
    parse_range,
    parse_size_mib,
    parse_version,
    recorded,
    shown,
)

VENDORS = ("nvidia", "amd", "apple", "intel")
BACKENDS = ("cuda", "rocm", "metal")
DEFAULT_BACKEND = {"nvidia": "cuda", "amd": "rocm", "apple": "metal"}
OS_NAMES = ("linux", "macos")
ARCHS = ("x86_64", "arm64")
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_NODE = 4096
_MAX_GPU_TEXT = 256
_MAX_GPU_NAME = 64


def one_of(value: str | None, allowed: tuple[str, ...], what: str) -> str | None:
    """`value` lower-cased if it is one of `allowed` (or None); ValueError naming them."""
    if value is None:
        return None
    if value.lower() not in allowed:
        raise ValueError(f"unknown {what} {shown(value)}; allowed: {', '.join(allowed)}")
    return value.lower()


def check_version(value: Any, what: str) -> Any:
    """A version field's value, refused unless `parse_version` reads it (None passes)."""
    if value is not None:
        parse_version(value, what)
    return value


def _is_size(token: str) -> bool:
    return any(token.lower().rstrip(".").endswith(u) for u in ("gb", "mb", "tb"))


_GPU_PARTS = {"vendor": "vendor", "memory": "memory", "count": "count"}


def _gpu_part(token: str) -> tuple[str, Any]:
    """Which part of a GPU text a `:`-separated token is, and its value: a vendor, a memory
    size or range, a count or range, or GPU models (each starting with a letter)."""
    if token.lower() in VENDORS:
        return "vendor", token.lower()
    if _is_size(token) or (".." in token and _is_size(token.replace("..", ""))):
        return "memory", token
    if token[0].isdigit() or token.startswith(".."):
        if any(c.isalpha() for c in token):
            raise ValueError(
                f"GPU part {shown(token)} is neither a count nor a memory size (sizes end in "
                "MB, GB or TB, e.g. 80GB)"
            )
        return "count", token
    names = [name.strip() for name in token.split(",")]
    odd = next((name for name in names if not name[:1].isalpha()), None)
    if odd is not None:
        raise ValueError(
            f"GPU part {shown(odd or token)} is not a GPU model, vendor, memory size or count; "
            "use e.g. A100:80GB:2"
        )
    return "names", names


def _count(value: Any) -> float:
    number = parse_count(value, "GPU count")
    if number != int(number) and not 0 < number < 1:
        raise ValueError(f"GPU count {shown(value)} must be a whole number, or a fraction below 1")
    if number > MAX_GPUS_PER_NODE:
        raise ValueError(f"GPU count {shown(value)} is above {MAX_GPUS_PER_NODE} per node")
    return number


def _names_once(value: dict[Any, Any]) -> dict[Any, Any]:
    """A GPU mapping with its models in `names`: `name: A100` (or `name: A100,H100`) is read as
    `names: [A100]`; both given is refused, as one of them would be dropped silently."""
    data = dict(value)
    if "name" not in data:
        return data
    name = data.pop("name")
    if "names" in data:
        raise ValueError(
            "name and names are both given; list every acceptable model in names, "
            "e.g. names: [A100, L4]"
        )
    if isinstance(name, str):
        data["names"] = name.split(",")
    elif isinstance(name, list):
        data["names"] = name
    else:
        said = "null" if name is None else shown(name)
        raise ValueError(f"name {said} is not a GPU model; write text, e.g. name: A100")
    return data


class GPUSpec(BaseModel):
    """GPU requirements of one node."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vendor: str | None = Field(default=None, examples=["nvidia"])
    """The GPU maker. Omitted: any vendor."""
    names: list[str] = Field(default_factory=list, max_length=32, examples=[["H100", "A100"]])
    """Acceptable GPU models, any one of them (case does not matter). `name: A100` works too,
    in place of `names`, not beside it. Omitted or empty: any model."""
    memory: Range | None = Field(default=None, examples=["40GB.."])
    """Memory per GPU, a size or a size range (compared in whole GB). Omitted: any."""
    count: Range = Field(default_factory=lambda: Range(min=1, max=1), examples=["1..4"])
    """GPUs per node: a number, or a range (the node takes as many free GPUs as the host has,
    within it). A fraction below 1 (e.g. 0.5) asks for that share of one GPU (not on hosts
    split into blocks, nor for multi-node jobs)."""
    compute_capability: str | None = Field(default=None, examples=["8.0"])
    """Minimum CUDA compute capability, in quotes. Omitted: any."""

    @field_validator("vendor")
    @classmethod
    def _vendor(cls, value: str | None) -> str | None:
        return one_of(value, VENDORS, "GPU vendor")

    @field_validator("names")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            check_text(name, "GPU name", max_length=_MAX_GPU_NAME, allow_empty=True)
        return [name.strip().upper() for name in value if name.strip()]

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability(cls, value: Any) -> Any:
        return check_version(value, "compute capability")

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return None if value is None else parse_range(value, parse_one=parse_size_mib)

    @field_validator("count", mode="before")
    @classmethod
    def _count_range(cls, value: Any) -> Any:
        return parse_range(value, parse_one=_count)

    @field_validator("count", mode="after")
    @classmethod
    def _count_bound(cls, value: Range) -> Range:
        if value.max is not None and value.max > MAX_GPUS_PER_NODE:
            raise ValueError(f"GPU count {value} is above {MAX_GPUS_PER_NODE} per node")
        return value

    @model_validator(mode="after")
    def _models_of_no_gpu(self, info: ValidationInfo) -> GPUSpec:
        """`A100:0` read as no GPU at all, its model dropped: the job could land on a host
        without GPUs."""
        if (
            self.count.max == 0
            and (self.names or self.memory or self.vendor)
            and not recorded(info)
        ):
            raise ValueError(f"asks for 0 GPUs of {self}; a job without GPUs omits gpu (or says 0)")
        return self

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
    def parse(cls, value: Any, context: Any = None) -> GPUSpec:
        """The GPU text or mapping as a GPUSpec; `context`: the validation context it is read
        in (`RECORDED` skips checks of new input)."""
        if isinstance(value, GPUSpec):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls.model_validate({"count": value}, context=context)
        if isinstance(value, dict):
            return cls.model_validate(_names_once(value), context=context)
        if not isinstance(value, str) or not value.strip() or len(value) > _MAX_GPU_TEXT:
            raise ValueError(
                f"{shown(value)} is not a GPU spec; use e.g. A100:80GB:2 or 24GB..:1..4"
            )
        fields: dict[str, Any] = {}
        given: dict[str, str] = {}
        for token in value.strip().split(":"):
            token = token.strip()
            if not token:
                raise ValueError(f"{shown(value)} has an empty part between ':'")
            field, part = _gpu_part(token)
            if field == "names" and field in given:
                raise ValueError(
                    f"{shown(value)} gives GPU models twice ({given[field]} and {token}); "
                    f"several models are one part: {given[field]},{token}"
                )
            if field in given:
                raise ValueError(
                    f"{shown(value)} gives the {_GPU_PARTS[field]} twice ({given[field]} and "
                    f"{token}); use e.g. A100:80GB:2"
                )
            given[field] = token
            fields[field] = part
        return cls.model_validate(fields, context=context)

    def __str__(self) -> str:
        parts = []
        if self.vendor:
            parts.append(self.vendor)
        if self.names:
            parts.append(",".join(self.names))
        if self.memory:
            parts.append(format_size_range(self.memory))
        parts.append(str(self.count))
        return ":".join(parts)


class ResourcesSpec(BaseModel):
    """Resources of one node: CPU in cores, memory and disk as sizes (see Values below)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gpu: GPUSpec | None = Field(default=None, examples=["A100:80GB:2"])
    """GPUs per node, as text (see GPUs below) or a mapping. Omitted, `null` or `0`: a
    CPU-only job."""
    cpu: Range = Field(default_factory=lambda: Range(min=1), examples=["4.."])
    """CPU cores per node, above 0 (a fraction of a core is allowed), at most 4096. The job
    reserves the lower bound; an upper bound is accepted but not used for placement."""
    memory: Range = Field(default_factory=lambda: Range(min=0), examples=["32GB.."])
    """Memory per node, a size or size range, at most 64TB; the job reserves the lower bound.
    Omitted: none reserved."""
    disk: Range = Field(default_factory=lambda: Range(min=0), examples=["100GB.."])
    """Free disk per node, a size or size range; the job reserves the lower bound. Omitted:
    none reserved."""
    os: str | None = Field(default=None, examples=["linux"])
    """The host's operating system. Omitted: any."""
    arch: str | None = Field(default=None, examples=["x86_64"])
    """The host's CPU architecture. Omitted: any."""
    backend: str | None = Field(default=None, examples=["cuda"])
    """The GPU software stack the host must have. Omitted: the GPU vendor's (nvidia: cuda,
    amd: rocm, apple: metal), or any."""
    min_driver: str | None = Field(default=None, examples=["535.0"])
    """Minimum GPU driver version, in quotes. Omitted: any."""

    @property
    def gpu_label(self) -> str:
        """How messages name the GPU ask, e.g. `A100:80GB:2`, or `no GPU`."""
        return str(self.gpu) if self.gpu is not None else "no GPU"

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value == 0:
            return None
        return GPUSpec.parse(value, info.context)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any, info: ValidationInfo) -> Any:
        cpu = parse_range(value)
        if max(cpu.min, cpu.max or 0) > MAX_CPUS_PER_NODE:
            raise ValueError(f"CPU count {cpu} is above {MAX_CPUS_PER_NODE} per node")
        if cpu.min == 0 and not recorded(info):
            raise ValueError(
                f"CPU count {cpu} reserves no CPU (a job reserves the lower bound); ask for "
                "more than 0, e.g. 1, 0.5 or 2..8"
            )
        return cpu

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any, info: ValidationInfo) -> Any:
        memory = parse_range(value, parse_one=parse_size_mib)
        if max(memory.min, memory.max or 0) > MAX_MEMORY_MIB and not recorded(info):
            asked = shown(value) if isinstance(value, str) else format_size_range(memory)
            raise ValueError(f"{asked} is above {format_size_mib(MAX_MEMORY_MIB)} per node")
        return memory

    @field_validator("disk", mode="before")
    @classmethod
    def _disk(cls, value: Any) -> Any:
        return parse_range(value, parse_one=parse_size_mib)

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        return one_of(value, BACKENDS, "backend")

    @field_validator("os")
    @classmethod
    def _os(cls, value: str | None) -> str | None:
        return one_of(value, OS_NAMES, "OS")

    @field_validator("arch")
    @classmethod
    def _arch(cls, value: str | None) -> str | None:
        return one_of(value, ARCHS, "CPU architecture")

    @field_validator("min_driver", mode="before")
    @classmethod
    def _min_driver(cls, value: Any) -> Any:
        return check_version(value, "min_driver")

    @property
    def gpu_count(self) -> float:
        return 0 if self.gpu is None else self.gpu.count.min

    @property
    def wants_gpu(self) -> bool:
        return self.gpu is not None and (self.gpu.count.max is None or self.gpu.count.max > 0)
