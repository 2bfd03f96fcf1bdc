"""deploy/docker without a Docker engine: every COPY source exists (in the context, past the
ignore file; or in the builder's bundle, made here by the same bundle.sh from the local build),
the context configures with CMake, the bundle is self-contained, and the image's ENTRYPOINT and
CMD start the real server."""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from dockerfile_parse import DockerfileParser

from deploy_assets import require_tool
from deploy_assets import DOCKERFILE, DOCKERIGNORE, REPO_ROOT
from server_process import _free_ports

BUNDLE_PREFIX = "/opt/attnserve"  # where the builder stage packs the server
# Libraries the runtime base image must provide itself (bundle.sh leaves them out).
SYSTEM_LIBRARIES = re.compile(
    r"^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda\.so)")


# --- the Dockerfile, read as BuildKit reads it ----------------------------------------------

def instructions():
    return DockerfileParser(path=str(DOCKERFILE)).structure


def arg_defaults():
    defaults = {}
    for i in instructions():
        match = re.fullmatch(r"([A-Za-z_]+)=(.*)", i["value"]) if i["instruction"] == "ARG" else None
        if match:
            defaults[match.group(1)] = match.group(2).strip('"')
    return defaults


def expand(text, variables):
    return re.sub(r"\$\{(\w+)\}", lambda m: variables.get(m.group(1), m.group(0)), text)


def stages():
    """[(stage name, base image, [instructions])]."""
    variables, found = arg_defaults(), []
    for _ in range(3):  # ARG defaults may refer to each other
        variables = {k: expand(v, variables) for k, v in variables.items()}
    for i in instructions():
        if i["instruction"] == "FROM":
            image, _, name = i["value"].partition(" AS ")
            found.append((name.strip(), expand(image.strip(), variables), []))
        elif found:
            found[-1][2].append(i)
    return found


def stage(name):
    return next(s for s in stages() if s[0] == name)


def copies(stage_instructions):
    """[(flags, sources, destination)] of a stage's COPY instructions."""
    result = []
    for i in stage_instructions:
        if i["instruction"] != "COPY":
            continue
        words = i["value"].split()
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        result.append((flags, paths[:-1], paths[-1]))
    return result


def exec_form(name):
    """The JSON (exec) form of ENTRYPOINT or CMD in the final stage."""
    (value,) = [i["value"] for i in stages()[-1][2] if i["instruction"] == name]
    return json.loads(value)


def image_env():
    env = {}
    for i in stages()[-1][2]:
        if i["instruction"] == "ENV":
            for key, value in re.findall(r"(\w+)=(\S+)", i["value"]):
                env[key] = value
    return env


# --- .dockerignore, with moby's patternmatcher semantics ------------------------------------

def ignore_patterns():
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").lstrip("/"))
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            else:
                regex += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        patterns.append((negate, re.compile(regex + r"\Z")))
    return patterns


def is_ignored(relative_path, patterns):
    """A path is left out when the last pattern matching it or one of its parents excludes."""
    parts = pathlib.PurePosixPath(relative_path).parts
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for negate, regex in patterns:
        if any(regex.match(p) for p in prefixes):
            ignored = not negate
    return ignored


def context_files(source, patterns):
    """Files under a COPY source that reach the build context."""
    root = REPO_ROOT / source
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    return [f for f in files if not is_ignored(f.relative_to(REPO_ROOT).as_posix(), patterns)]


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle(attnserve_binary, tmp_path_factory):
    """The builder's /opt/attnserve, made by the Dockerfile's own bundle step from the build."""
    (run,) = [i["value"] for i in stage("builder")[2]
              if i["instruction"] == "RUN" and "bundle.sh" in i["value"]]
    match = re.search(r"(deploy/docker/bundle\.sh) (\S+) (\S+)", run)
    assert match and match.group(3) == BUNDLE_PREFIX, run
    build_dir = attnserve_binary.parent.parent
    prefix = tmp_path_factory.mktemp("image") / "opt-attnserve"
    subprocess.run([str(REPO_ROOT / match.group(1)), str(build_dir), str(prefix)], check=True,
                   timeout=120)
    return prefix


# --- tests -----------------------------------------------------------------------------------

def test_two_stages_on_the_expected_bases():
    (builder, builder_image, _), (runtime, runtime_image, runtime_steps) = stages()
    assert (builder, builder_image) == ("builder", "debian:bookworm")
    assert runtime == "runtime"
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", runtime_image)
    (user,) = [i["value"] for i in runtime_steps if i["instruction"] == "USER"]
    uid, gid = (int(x) for x in user.split(":"))
    assert uid >= 1000 and gid >= 1000, "the server must not run as root"
    builder_runs = " ".join(i["value"] for i in stage("builder")[2] if i["instruction"] == "RUN")
    assert "scripts/setup.sh" in builder_runs and "scripts/build.sh" in builder_runs


def test_context_copies_exist_and_pass_the_ignore_file():
    patterns = ignore_patterns()
    sources = [s for flags, srcs, _ in copies(stage("builder")[2]) for s in srcs]
    assert "scripts/" in sources and "server/" in sources
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert context_files(source, patterns), f"COPY {source}: excluded by {DOCKERIGNORE.name}"
    # And the ignore file keeps the heavy local trees out of the context.
    for heavy in ("build/bin/attnserve", ".venv/bin/python", ".git/HEAD", "build-gpu/x"):
        assert is_ignored(heavy, patterns), heavy
    assert is_ignored("client/python/attnserve/__pycache__/client.cpython-311.pyc", patterns)
    assert not is_ignored("client/python/attnserve/client.py", patterns)


def test_context_is_enough_to_configure_the_build(tmp_path):
    """CMake configures from exactly the files the builder stage copies, with its flags."""
    require_tool("cmake")
    patterns = ignore_patterns()
    context = tmp_path / "src"
    for _, sources, _ in copies(stage("builder")[2]):
        for source in sources:
            for f in context_files(source, patterns):
                target = context / f.relative_to(REPO_ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
    (run,) = [i["value"] for i in stage("builder")[2]
              if i["instruction"] == "RUN" and "scripts/build.sh" in i["value"]]
    flags = re.findall(r"-D[A-Z_]+=[A-Z]+", run)
    assert "-DATTN_BUILD_TESTS=OFF" in flags
    if not os.path.exists("/usr/local/cuda/bin/nvcc"):  # the image's builder always has it
        flags = [f for f in flags if not f.startswith("-DATTN_WITH_CUDA")] + ["-DATTN_WITH_CUDA=OFF"]
    result = subprocess.run(["cmake", "-S", str(context), "-B", str(tmp_path / "build"),
                             "-G", "Ninja", *flags], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_runtime_copies_exist_in_the_bundle(bundle):
    runtime_copies = copies(stages()[-1][2])
    assert runtime_copies
    for flags, sources, destination in runtime_copies:
        assert "--from=builder" in flags, "the runtime stage takes only the builder's bundle"
        for source in sources:
            assert source.startswith(BUNDLE_PREFIX + "/"), source
            local = bundle / source[len(BUNDLE_PREFIX) + 1:]
            assert local.exists() and any(local.iterdir()), f"COPY {source}: empty or missing"
    for binary in ("attnserve", "attnctl", "attnload"):
        assert (bundle / "bin" / binary).is_file(), binary


def test_bundle_is_self_contained(bundle):
    """With the image's LD_LIBRARY_PATH, every library but libc's family resolves inside it."""
    env = dict(os.environ, LD_LIBRARY_PATH=image_env()["LD_LIBRARY_PATH"].replace(
        BUNDLE_PREFIX, str(bundle)))
    for binary in ("attnserve", "attnctl", "attnload"):
        out = subprocess.run(["ldd", str(bundle / "bin" / binary)], env=env, check=True,
                             capture_output=True, text=True).stdout
        assert "not found" not in out
        for line in out.splitlines():
            name = line.split()[0]
            if SYSTEM_LIBRARIES.match(name) or name.startswith("/"):
                continue
            assert str(bundle / "lib") in line, f"{binary}: {line.strip()} is not bundled"
    assert any(p.name.startswith("libgrpc++") for p in (bundle / "lib").iterdir())


def test_entrypoint_and_cmd_start_the_server(bundle, tmp_path):
    """The image's command line, run from the bundle with the image's library path; only the
    listen address and ports are overridden (appended: absl takes a repeated flag's last value)."""
    entrypoint, cmd = exec_form("ENTRYPOINT"), exec_form("CMD")
    assert entrypoint == [f"{BUNDLE_PREFIX}/bin/attnserve"]
    assert {"--host=0.0.0.0", "--grpc_port=8001", "--http_port=8000"} <= set(cmd)
    exposed = {int(p) for i in stages()[-1][2] if i["instruction"] == "EXPOSE"
               for p in i["value"].split()}
    assert exposed == {8001, 8000}
    grpc_port, http_port = _free_ports(2)
    command = [str(bundle / "bin" / "attnserve"), *cmd, "--host=127.0.0.1",
               f"--grpc_port={grpc_port}", f"--http_port={http_port}"]
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": image_env()["LD_LIBRARY_PATH"].replace(
        BUNDLE_PREFIX, str(bundle))}
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        ready = False
        while time.monotonic() < deadline and process.poll() is None and not ready:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2) as r:
                    ready = r.status == 200
            except OSError:
                time.sleep(0.1)
        assert ready, (tmp_path / "server.log").read_text()
        # The gRPC library the server loaded is the bundled one.
        maps = pathlib.Path(f"/proc/{process.pid}/maps").read_text()
        assert str(bundle / "lib" / "libgrpc++") in maps
        # And it allocates through the bundled tcmalloc (CMakeLists.txt, ATTN_TCMALLOC).
        assert str(bundle / "lib" / "libtcmalloc_minimal") in maps
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0, (tmp_path / "server.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
