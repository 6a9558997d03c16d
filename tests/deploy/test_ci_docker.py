"""``.ci/docker image``'s wheel server: two builds at once never clash on its port. The script runs for real with a
stand-in ``docker`` first on PATH (no engine needed) whose ``build`` downloads the torch wheel from the
``WHEELS_URL`` build argument while the other build's server is up too."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from labswarm.manager.server import free_port

ROOT = Path(__file__).resolve().parents[2]

FAKE_DOCKER = """#!PYTHON
import os, sys, time, urllib.request
from pathlib import Path
args, record = sys.argv[1:], Path(os.environ["FAKE_DOCKER_RECORD"])
if args[:2] == ["image", "inspect"]:
    if "Size" in args[3]:
        print(1000000)
    elif (record / ("built-" + args[-1].replace(":", "_"))).exists():
        print("sha256:" + args[-1].replace(":", "_"))
    else:
        sys.exit(1)
elif args[0] == "build":
    url = next(a.split("=", 1)[1] for a in args if a.startswith("WHEELS_URL="))
    tag = args[args.index("-t") + 1].replace(":", "_")
    (record / ("started-" + tag)).write_text(url)
    deadline = time.monotonic() + 60  # both builds' servers up at once
    while len(list(record.glob("started-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    (record / ("wheel-" + tag)).write_bytes(opener.open(url + "torch-0.0-py3-none-any.whl", timeout=30).read())
    (record / ("built-" + tag)).write_text("")
"""


def test_two_image_builds_at_once_serve_the_wheels_on_two_ports(tmp_path: Path) -> None:
    bin_dir, record, wheels = tmp_path / "bin", tmp_path / "record", tmp_path / "wheels"
    for folder in (bin_dir, record, wheels):
        folder.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.replace("PYTHON", sys.executable, 1))
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    (wheels / "torch-0.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    preferred = free_port()  # below the ephemeral range: no connect() of the machine takes it before the build
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_RECORD": str(record), "TRAIN": "1",
           "LABSWARM_DOCKER_WHEELS": str(wheels), "LABSWARM_DOCKER_WHEELS_PORT": str(preferred),
           "LABSWARM_DOCKER_LOG_DIR": str(tmp_path / "log"), "LABSWARM_DOCKER_STATE_DIR": str(tmp_path / "state")}
    builds = [subprocess.Popen(["bash", str(ROOT / ".ci" / "docker"), "image"], env={**env, "IMAGE": f"t:{n}"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in (1, 2)]
    outputs = [build.communicate(timeout=120)[0] for build in builds]
    assert [build.returncode for build in builds] == [0, 0], outputs
    urls = sorted((record / f"started-t_{n}").read_text() for n in (1, 2))
    ports = {int(url.rsplit(":", 1)[1].strip("/")) for url in urls}
    assert len(ports) == 2 and preferred in ports, urls  # one on the usual port (its cache), one beside it
    assert all((record / f"wheel-t_{n}").read_bytes() == b"wheel bytes" for n in (1, 2))
    assert "is taken (another build?)" in "".join(outputs), outputs
