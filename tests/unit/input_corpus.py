"""Known-bad and known-good job, fleet and profile files: the oracle for "wrongly accepted".

Each bad entry holds the file's bytes and a piece of the one-line refusal expected, so a test
learns not only that the file was refused but that it was refused for the right reason. The
fuzz tests, the spec tests and benchmarks/fuzz_inputs.py all read this one list.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

JOB = "name: fuzz\ncommands: [echo hi]\n"
FLEET = "type: fleet\nname: f\nkind: sim\nhosts:\n  - name: a\n"
SSH_FLEET = "type: fleet\nname: f\nkind: ssh\nhosts:\n  - name: a\n    hostname: 127.0.0.1\n"
_GPU_HOST = "    gpus: [{name: A100, memory: 80GB, compute_capability: '8.0'}]\n"


# Values a careless user or an attacker writes, put into any field by the fuzz tests.
NASTY = [
    ".inf",
    "-.inf",
    ".nan",
    "1e400",
    "1.0e+400",
    "-1",
    "0",
    "9" * 30,
    "9" * 5000,
    "0x7fffffffffffffffff",
    "1:30:00",
    "!!int abc",
    "!!float x",
    "!!bool maybe",
    "!!binary AA==",
    "!!timestamp 2024-02-30",
    "2024-02-30",
    "2001-12-14t21:59:43.10-05:00",
    "!!set {a: null}",
    "!!omap [a: 1]",
    "!!python/object/apply:os.system ['true']",
    "!local x",
    "'\u00b2'",
    "'\u0663\u0663'",
    "'\uff18'",
    '"\\0"',
    '"a\\0b"',
    "'" + "x" * 10_000 + "'",
    "&a [*a]",
    "*undefined",
    "[" * 100 + "]" * 100,
    "{a: " * 40 + "1" + "}" * 40,
    "~",
    "yes",
    "''",
    "'[/bold]'",
    "{<<: 5}",
    "[1, [2, [3]]]",
    "{min: .nan}",
    "{min: 1, max: .inf}",
    "'A100:.inf'",
    "'1..'",
    "'..'",
    "'²GB'",
    "'535.104.05'",
    "'8.0'",
    "10m",
    "1h30m",
    "366d",
    "367d",
]

JOB_FIELDS = [
    "name",
    "commands",
    "env",
    "working_dir",
    "resources",
    "max_duration",
    "retry",
    "nodes",
    "priority",
    "fleets",
    "labels",
    "tolerations",
    "placement",
    "scorer",
    "profile",
    "alternatives",
    "type",
]
FLEET_HOST_FIELDS = [
    "driver_version",
    "cpus",
    "memory",
    "disk",
    "port",
    "hostname",
    "user",
    "identity_file",
    "blocks",
    "labels",
    "taints",
    "gpus",
    "backend",
    "state",
]


def _bomb(levels: int = 9) -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nname: bomb\ncommands: *l{levels - 1}\n"


BAD_JOBS: list[tuple[str, bytes, str]] = [
    ("non-utf8", b"name: x\ncommands: [\xff\xfe]\n", "not UTF-8"),
    ("latin-1", "name: café\ncommands: [x]\n".encode("latin-1"), "not UTF-8"),
    ("empty", b"", "the file is empty"),
    ("comments only", b"# nothing\n", "the file is empty"),
    ("a list", b"- a\n- b\n", "expected a mapping of fields"),
    ("profile not text", (JOB + "profile: 123\n").encode(), "is not a profile name or path"),
    ("profile long", (JOB + "profile: " + "a/" * 3000 + "p.yaml\n").encode(), "profile"),
    ("profile NUL", (JOB + 'profile: "a\\0.yaml"\n').encode(), "profile"),
    ("max_duration inf", (JOB + "max_duration: .inf\n").encode(), "not a duration"),
    ("max_duration nan", (JOB + "max_duration: .nan\n").encode(), "not a duration"),
    ("max_duration 1e20", (JOB + "max_duration: 1.0e+20\n").encode(), "longer than 366d"),
    ("max_duration 2y", (JOB + "max_duration: 800d\n").encode(), "longer than 366d"),
    ("max_duration long", (JOB + f"max_duration: '{'1' * 50_000}'\n").encode(), "not a duration"),
    ("max_duration digits", (JOB + "max_duration: '\u0663h'\n").encode(), "not a duration"),
    ("max_duration date", (JOB + "max_duration: 2024-02-30\n").encode(), "not a duration"),
    ("retry duration", (JOB + "retry: {duration: 1.0e+20}\n").encode(), "longer than 366d"),
    (
        "retry attempts",
        (JOB + "retry: {max_attempts: 0}\n").encode(),
        "use a whole number, 1..10000",
    ),
    ("huge int", (JOB + "priority: " + "9" * 5000 + "\n").encode(), "as int"),
    ("big int", (JOB + "priority: " + "9" * 40 + "\n").encode(), "too large"),
    ("int tag", (JOB + "priority: !!int abc\n").encode(), "cannot read 'abc' as int"),
    ("bool tag", (JOB + "priority: !!bool maybe\n").encode(), "as bool"),
    ("binary tag", (JOB + "working_dir: !!binary aGVsbG8=\n").encode(), "!!binary"),
    ("python tag", (JOB + "working_dir: !!python/name:os.system x\n").encode(), "not allowed"),
    ("set tag", (JOB + "labels: !!set {a, b}\n").encode(), "!!set"),
    ("timestamp tag", (JOB + "working_dir: !!timestamp 2024-02-30\n").encode(), "timestamp"),
    ("local tag", (JOB + "working_dir: !mine x\n").encode(), "not allowed"),
    ("alias bomb", _bomb().encode(), "values with aliases expanded"),
    ("recursive alias", b"name: x\ncommands: &a [*a]\n", "refers to itself"),
    ("deep nesting", (JOB + "labels: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "deeper"),
    ("deep mapping", (JOB + "labels: " + "{a: " * 200 + "1" + "}" * 200 + "\n").encode(), "deeper"),
    ("duplicate key", b"name: x\nname: y\ncommands: [a]\n", "given twice"),
    ("NUL byte", b"name: x\x00\ncommands: [a]\n", "malformed YAML"),
    ("command NUL", b'name: x\ncommands: ["a\\0b"]\n', "NUL"),
    ("command not text", b"name: x\ncommands: [true]\n", "true was read by YAML as the boolean"),
    ("env name =", (JOB + "env: {'A=B': x}\n").encode(), "env: name"),
    ("env name empty", (JOB + "env: {'': x}\n").encode(), "env: name"),
    ("env name NUL", (JOB + 'env: {"A\\0": x}\n').encode(), "env: name"),
    ("env name digit", (JOB + "env: {1A: x}\n").encode(), "env: name"),
    ("env list =", (JOB + "env: ['=x']\n").encode(), "env: name"),
    ("env value NUL", (JOB + 'env: {A: "x\\0y"}\n').encode(), "NUL"),
    ("env value map", (JOB + "env: {A: {b: c}}\n").encode(), "must be text"),
    ("working_dir NUL", (JOB + 'working_dir: "/tmp/\\0"\n').encode(), "NUL"),
    ("working_dir long", (JOB + f"working_dir: /{'a' * 5000}\n").encode(), "longer than 4096"),
    ("working_dir empty", (JOB + "working_dir: ''\n").encode(), "working_dir is empty"),
    ("min_driver ²", (JOB + "resources: {gpu: 1, min_driver: '²'}\n").encode(), "not a version"),
    ("min_driver float", (JOB + "resources: {gpu: 1, min_driver: 535.4}\n").encode(), "quotes"),
    (
        "capability text",
        (JOB + "resources: {gpu: {count: 1, compute_capability: ampere}}\n").encode(),
        "not a version",
    ),
    ("cpu nan", (JOB + "resources: {cpu: .nan}\n").encode(), "not a finite number"),
    ("cpu inf", (JOB + "resources: {cpu: .inf}\n").encode(), "not a finite number"),
    ("cpu huge", (JOB + "resources: {cpu: 100000}\n").encode(), "above 4096"),
    ("cpu range nan", (JOB + "resources: {cpu: {min: .nan}}\n").encode(), "finite"),
    ("memory negative", (JOB + "resources: {memory: -1GB}\n").encode(), "not a size"),
    ("memory inf", (JOB + "resources: {memory: .inf}\n").encode(), "not a size"),
    ("disk huge", (JOB + "resources: {disk: 1.0e+30}\n").encode(), "above"),
    ("gpu inf", (JOB + "resources: {gpu: .inf}\n").encode(), "not a finite number"),
    ("gpu count ²", (JOB + "resources: {gpu: 'A100:²'}\n").encode(), "not a number"),
    ("gpu count huge", (JOB + "resources: {gpu: 'A100:100000'}\n").encode(), "per node"),
    ("gpu memory nan", (JOB + "resources: {gpu: {memory: .nan}}\n").encode(), "not a size"),
    ("gpu name NUL", (JOB + 'resources: {gpu: "A\\0:1"}\n').encode(), "NUL"),
    ("gpu text long", (JOB + f"resources: {{gpu: '{'A' * 1000}'}}\n").encode(), "GPU spec"),
    ("os unknown", (JOB + "resources: {os: windows}\n").encode(), "unknown OS"),
    ("arch unknown", (JOB + "resources: {arch: sparc}\n").encode(), "CPU architecture"),
    ("selection ²", (JOB + "placement: {gpus: ['h:²']}\n").encode(), "HOST:INDEX"),
    ("selection host", (JOB + "placement: {hosts: ['a b']}\n").encode(), "host name"),
    ("fleet name", (JOB + "fleets: ['Bad Name']\n").encode(), "fleet name"),
    ("label NUL", (JOB + 'labels: {a: "\\0"}\n').encode(), "NUL"),
    ("toleration long", (JOB + f"tolerations: ['{'t' * 5000}']\n").encode(), "longer"),
    ("nodes huge", (JOB + "nodes: 100000\n").encode(), "use a whole number, 1..1024"),
    ("nodes float", (JOB + "nodes: 1.5\n").encode(), "nodes"),
    ("priority nan", (JOB + "priority: .nan\n").encode(), "priority"),
    (
        "utilization nan",
        (
            JOB + "resources: {gpu: 1}\n"
            "utilization_policy: {min_gpu_utilization: .nan, time_window: 10m}\n"
        ).encode(),
        "min_gpu_utilization",
    ),
    (
        "window inf",
        (
            JOB + "resources: {gpu: 1}\n"
            "utilization_policy: {min_gpu_utilization: 5, time_window: .inf}\n"
        ).encode(),
        "not a duration",
    ),
    ("name markup", b"name: '[/bold]'\ncommands: [a]\n", "job name"),
    ("unknown field", (JOB + "resourcez: {}\n").encode(), "unknown field"),
    ("fleet as job", FLEET.encode(), "is not a job"),
]

BAD_FLEETS: list[tuple[str, bytes, str]] = [
    ("driver ²", (FLEET + "    driver_version: '²'\n").encode(), "not a version"),
    ("driver float", (FLEET + "    driver_version: 535.4\n").encode(), "quotes"),
    (
        "capability ²",
        (FLEET + "    gpus: [{name: A100, memory: 80GB, compute_capability: '8.²'}]\n").encode(),
        "not a version",
    ),
    ("port 0", (SSH_FLEET + "    port: 0\n").encode(), "port"),
    ("port 70000", (SSH_FLEET + "    port: 70000\n").encode(), "port"),
    ("port nan", (SSH_FLEET + "    port: .nan\n").encode(), "port"),
    ("hostname space", (SSH_FLEET.replace("127.0.0.1", "'a b'")).encode(), "hostname"),
    ("hostname NUL", (SSH_FLEET.replace("127.0.0.1", '"a\\0"')).encode(), "hostname"),
    ("user NUL", (SSH_FLEET + '    user: "a\\0"\n').encode(), "user"),
    ("identity NUL", (SSH_FLEET + '    identity_file: "/k\\0"\n').encode(), "NUL"),
    ("memory negative", (FLEET + "    memory: -5GB\n").encode(), "not a size"),
    ("memory zero", (FLEET + "    memory: 0\n").encode(), "memory"),
    ("memory inf", (FLEET + "    memory: .inf\n").encode(), "not a size"),
    ("disk huge", (FLEET + "    disk: 1.0e+300\n").encode(), "above"),
    ("gpu memory 0", (FLEET + "    gpus: [{name: A100, memory: 0}]\n").encode(), "memory"),
    (
        "gpu count 0",
        (FLEET + "    gpus: [{name: A100, memory: 80GB, count: 0}]\n").encode(),
        "count",
    ),
    ("gpu name NUL", (FLEET + '    gpus: [{name: "A\\0", memory: 80GB}]\n').encode(), "NUL"),
    ("cpus 0", (FLEET + "    cpus: 0\n").encode(), "cpus"),
    ("cpus huge", (FLEET + "    cpus: 100000000\n").encode(), "cpus"),
    ("blocks 0", (FLEET + "    blocks: 0\n").encode(), "blocks"),
    ("weight inf", (FLEET + "scorer_weights: {gpu: .inf}\n").encode(), "finite"),
    ("weight nan", (FLEET + "scorer_weights: {gpu: .nan}\n").encode(), "finite"),
    ("weight huge", (FLEET + "scorer_weights: {gpu: 1.0e+9}\n").encode(), "at most 1000"),
    ("weight negative", (FLEET + "scorer_weights: {gpu: -1}\n").encode(), "0 or more"),
    ("label NUL", (FLEET + '    labels: {a: "\\0"}\n').encode(), "NUL"),
    ("host name", (FLEET.replace("name: a", "name: A_1")).encode(), "host name"),
    ("simulated nan", (FLEET + "utilization: {source: constant, value: .nan}\n").encode(), "value"),
    ("type missing", b"name: f\nkind: sim\n", "type is missing: a fleet file says `type: fleet`"),
    ("non-utf8", FLEET.encode() + b"    labels: {a: \xc3\x28}\n", "not UTF-8"),
    ("alias bomb", _bomb().replace("name: bomb", "type: fleet\nname: f").encode(), "aliases"),
]

BAD_PROFILES: list[tuple[str, bytes, str]] = [
    ("names the job", b"name: sneaky\n", "not allowed in a profile"),
    ("bad duration", b"max_duration: .inf\n", "not a duration"),
    ("bad env", b"env: {'A B': x}\n", "env: name"),
    ("non-utf8", b"max_duration: \xff\n", "not UTF-8"),
    ("a list", b"- x\n", "expected a mapping"),
]

GOOD_JOBS: list[tuple[str, bytes]] = [
    ("minimal", JOB.encode()),
    ("year", (JOB + "max_duration: 366d\nretry: {duration: 366d, max_attempts: 3}\n").encode()),
    ("off", (JOB + "max_duration: off\nretry: true\n").encode()),
    ("seconds", (JOB + "max_duration: 90\n").encode()),
    ("compound", (JOB + "max_duration: 1h 30m\n").encode()),
    ("fraction", (JOB + "resources: {gpu: 'T4:0.5'}\n").encode()),
    (
        "versions",
        (
            JOB + "resources: {gpu: {count: 1, compute_capability: '8.0'}, "
            "min_driver: '535.104.05'}\n"
        ).encode(),
    ),
    ("env", (JOB + "env: {_A1: x, PATH_2: '', B: 3}\n").encode()),
    ("env list", (JOB + "env: ['A=1', 'B=x=y']\n").encode()),
    ("working_dir", (JOB + "working_dir: ./sub/dir\n").encode()),
    ("sizes", (JOB + "resources: {memory: 1TB, disk: 512MB.., cpu: 2..64}\n").encode()),
    ("anchors", (JOB + "alternatives: [&a {gpu: 'A100:1'}, *a]\nresources: {gpu: 2}\n").encode()),
    ("unicode text", "name: x\ncommands: ['echo héllo ✓']\n".encode()),
    ("bom", b"\xef\xbb\xbf" + JOB.encode()),
    ("os arch", (JOB + "resources: {os: Linux, arch: x86_64}\n").encode()),
    ("selection", (JOB + "placement: {gpus: ['gpu-1:0', 'gpu-1:7']}\n").encode()),
]

GOOD_FLEETS: list[tuple[str, bytes]] = [
    ("minimal", FLEET.encode()),
    ("gpus", (FLEET + _GPU_HOST + "    driver_version: '535.104.05'\n").encode()),
    (
        "ssh",
        (SSH_FLEET + "    port: 65535\n    user: ml\n    identity_file: ~/.ssh/id\n").encode(),
    ),
    ("ipv6", SSH_FLEET.replace("127.0.0.1", "'::1'").encode()),
    ("weights", (FLEET + "scorer_weights: {gpu: 0, cpu: 1000}\n").encode()),
    (
        "anchors",
        (
            b"type: fleet\nname: f\nkind: sim\nhosts:\n"
            b"  - &h {name: a, gpus: [{name: A100, memory: 80GB}]}\n"
            b"  - {<<: *h, name: b}\n"
        ),
    ),
]


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))
