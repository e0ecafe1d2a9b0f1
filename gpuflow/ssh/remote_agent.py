"""The script that finds, starts or stops a host's agent, run on the host itself: its source is
sent over SSH by gpuflow.ssh.provisioning (nothing of gpuflow needs to be installed for it)."""

from __future__ import annotations


def agent_control(request_json: str) -> int:
    """Runs on the host, sent as source: find, start or stop this host's agent; prints a reply.

    Self-contained on purpose (standard library only, imported inside) so that the host needs
    nothing but Python to run it. The pidfile records the agent's argv, and a pid counts as the
    agent only while its command line still ends with those arguments: a reused pid or a zombie
    does not. The pidfile also records the identity of the files the agent reads when it
    connects (TLS, API key): a changed file means a restart, or the agent would go on with an
    old certificate or key."""
    import fcntl
    import importlib.util
    import json
    import os
    import signal
    import subprocess
    import time

    request = json.loads(request_json)
    host_id = request["host_id"]
    state_dir = os.path.abspath(os.path.expanduser(request["state_dir"]))
    pid_path = os.path.join(state_dir, "agent.pid")
    log_path = os.path.join(state_dir, "agent.log")
    values = dict(request.get("values", {}), state_dir=state_dir)
    values["python"] = os.path.expanduser(values.get("python", ""))
    # the agent is started without a shell, so `~` is expanded here; relative to the login
    # directory, like `push_ssh_file`
    file_fields = request.get("files", [])
    for name in file_fields:
        values[name] = os.path.abspath(os.path.expanduser(values[name]))

    def file_identities() -> dict[str, list[int]]:
        identities: dict[str, list[int]] = {}
        for name in file_fields:
            try:
                stat = os.stat(values[name])
            except OSError:
                continue  # the agent says which file it cannot read
            identities[values[name]] = [stat.st_ino, stat.st_mtime_ns, stat.st_size]
        return identities

    def reply(**fields: object) -> int:
        print(json.dumps(fields))
        return 0

    def command_line(pid: int) -> str | None:
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        if os.path.isdir("/proc/self"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    raw = file.read()
            except OSError:
                return None
            words = [word.decode(errors="replace") for word in raw.split(b"\0") if word]
            return " ".join(words) or None
        ps = subprocess.run(["ps", "-p", str(pid), "-o", "command="], capture_output=True)
        return ps.stdout.decode(errors="replace").strip() or None

    def running(record: dict[str, object]) -> bool:
        pid, argv = record.get("pid"), record.get("argv")
        if not isinstance(pid, int) or not isinstance(argv, list):
            return False
        line = command_line(pid)
        # only the arguments count: a wrapper such as a pyenv shim or a venv launcher script
        # execs the real interpreter under the same pid, which changes the program's name
        arguments = " ".join(str(word) for word in argv[1:])
        if line is None or not arguments:
            return line is not None
        return line == arguments or line.endswith(" " + arguments)

    def read_record() -> dict[str, object] | None:
        try:
            with open(pid_path) as file:
                record = json.load(file)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def signal_agent(pid: int, signum: int) -> None:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
        except OSError:
            pass

    def stop(record: dict[str, object]) -> None:
        pid = int(str(record["pid"]))
        for signum, wait_s in ((signal.SIGTERM, request["stop_timeout"]), (signal.SIGKILL, 5.0)):
            signal_agent(pid, signum)
            deadline = time.monotonic() + wait_s
            while running(record) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not running(record):
                return

    def other_host(record: dict[str, object]) -> int:
        return reply(
            error="state_dir_in_use",
            message=f"state dir {state_dir} belongs to the running agent of host "
            f"{record.get('host_id')}; give every host its own state dir",
        )

    os.makedirs(state_dir, exist_ok=True)
    os.chdir(state_dir)
    with open(os.path.join(state_dir, "agent.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read_record()
        is_running = record is not None and running(record)
        if record is not None and is_running and record.get("host_id") != host_id:
            return other_host(record)

        if request["op"] == "stop":
            if record is None or not is_running:
                if record is not None:
                    os.unlink(pid_path)
                return reply(stopped=False, pid=None)
            stop(record)
            os.unlink(pid_path)
            return reply(stopped=True, pid=record["pid"])

        argv = [item.format(**values) for item in request["argv_template"]]
        identities = file_identities()
        if record is not None and is_running:
            if record.get("argv") == argv and record.get("files", {}) == identities:
                return reply(started=False, pid=record["pid"], log_path=log_path)
            stop(record)
        replaced_pid = record["pid"] if record is not None and is_running else None

        if len(argv) > 2 and argv[1] == "-m":
            try:
                found = importlib.util.find_spec(argv[2]) is not None
            except ImportError:
                found = False
            if not found:
                return reply(
                    error="gpuflow_missing",
                    message=f"{argv[0]} on the host cannot import {argv[2]}; pip install "
                    "gpuflow there or set `python` to the interpreter that has it",
                )
        with open(log_path, "ab") as log:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                return reply(
                    error="python_missing",
                    message=f"cannot start {argv[0]} on the host ({exc.strerror}); set "
                    "`python` to the interpreter that has gpuflow",
                )
        temporary = pid_path + ".tmp"
        with open(temporary, "w") as file:
            json.dump(
                {"pid": process.pid, "host_id": host_id, "argv": argv, "files": identities}, file
            )
        os.replace(temporary, pid_path)

        deadline = time.monotonic() + request["startup_grace"]
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is not None:
            os.unlink(pid_path)
            with open(log_path, "rb") as log_file:
                lines = log_file.read()[-4000:].decode(errors="replace").strip().splitlines()
            last = lines[-1].strip()[:300] if lines else "no output"
            return reply(
                error="agent_exited",
                message=f"the agent exited at once (status {process.returncode}): {last}; "
                f"see {log_path} on the host",
            )
        return reply(started=True, pid=process.pid, log_path=log_path, replaced_pid=replaced_pid)
