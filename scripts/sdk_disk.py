"""The daemon's files as scripts/sdk-test's Python checks (and scripts/proto-client) look at
them, apart from the SDK call under test: what a write left on disk, a file's extended
attributes, and what a check puts there itself (a directory, a file a watcher must see).

Local mode (sdk-test started the daemon on this machine): the files themselves, with `os`.
Remote mode (SDK_REMOTE=1: sdk-test was given SDK_TEST_URL, a daemon already running, such as
the one in a QEMU guest): the same facts through the daemon's own process service, as root,
with the e2b wheel's generated messages over connectrpc (as scripts/proto-client), not the
SDK's commands API: `cat` for a file's bytes, GNU tar's pax records (`SCHILY.xattr.*`) for its
extended attributes (the template guest has no getfattr), `mkdir -p`, `base64 -d` into a file,
`test -e`, `rm -rf` of a check's own work directory before it starts (a remote home keeps what
an earlier run left).
"""

import base64
import io
import json
import os
import shutil
import tarfile

REMOTE = os.environ.get("SDK_REMOTE") == "1"
# A command in a TCG guest takes about 100 ms; a minute is the SDK's own default.
TIMEOUT_MS = 60_000
_client = None


def _sh(script, *args, user="root"):
    """`sh -c script sh args...` as `user` in the daemon's machine; its stdout (exit 0 expected)."""
    global _client
    from connectrpc.codec import proto_binary_codec
    from e2b.envd.process import process_connect, process_pb as P

    if _client is None:
        _client = process_connect.ProcessClientSync(
            os.environ["SDK_URL"], codec=proto_binary_codec())
    request = P.StartRequest.from_json(json.dumps(
        {"process": {"cmd": "/bin/sh", "args": ["-c", script, "sh", *args]}}))
    headers = {"X-Access-Token": os.environ["SDK_TOKEN"],
               "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}
    stdout, stderr, code = b"", b"", None
    for response in _client.start(request, headers=headers, timeout_ms=TIMEOUT_MS):
        event = response.event.event
        if event is None:
            continue
        if event.field == "data":
            output = event.value.output
            if output.field == "stdout":
                stdout += output.value
            elif output.field == "stderr":
                stderr += output.value
        elif event.field == "end":
            code = event.value.exit_code
    if code != 0:
        raise AssertionError(
            f"in the daemon's machine, sh -c {script!r} {list(args)}: exit {code}: {stderr[:200]!r}")
    return stdout


def read(path):
    """The bytes of file `path`."""
    if not REMOTE:
        with open(path, "rb") as f:
            return f.read()
    return _sh('exec cat -- "$1"', path)


def xattr(path, name):
    """Extended attribute `name` (`user.*`) of `path`, as bytes; KeyError when it has none."""
    if not REMOTE:
        return os.getxattr(path, name)
    archive = _sh('exec tar --xattrs --xattrs-include="user.*" -cf - -C "$(dirname -- "$1")" '
                  '-- "$(basename -- "$1")"', path)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.getmember(os.path.basename(path))
    value = member.pax_headers.get("SCHILY.xattr." + name)
    if value is None:
        raise KeyError(f"no {name} on {path} (tar saw {sorted(member.pax_headers)})")
    return value.encode("utf-8", "surrogateescape")


def makedirs(path):
    """`path` made with its parents, as root; it must not exist yet."""
    if not REMOTE:
        os.makedirs(path)
        return
    _sh('[ ! -e "$1" ] && mkdir -p -- "$1"', path)


def write(path, data):
    """File `path` (its directory made if missing) holding `data`, as root."""
    if not REMOTE:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return
    _sh('mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" | base64 -d > "$1"',
        path, base64.b64encode(data).decode())


def exists(path):
    if not REMOTE:
        return os.path.exists(path)
    return _sh('if [ -e "$1" ]; then echo yes; else echo no; fi', path) == b"yes\n"


def fresh(path):
    """Nothing at `path`: a check's work directory before it starts."""
    if not REMOTE:
        shutil.rmtree(path, ignore_errors=True)
        return
    _sh('rm -rf -- "$1"', path)


def run_as(user, script):
    """`sh -c script` as `user` in a remote daemon's machine (the uid it really ran as, say)."""
    return _sh(script, user=user).decode()
