"""Child-side confinement, run by the harness (box.HARNESS) before it imports any candidate code.

Inside the namespaces `unshare` made (pid, net, mount), as root: make every mount private, keep only the
job's box writable (the rest of the filesystem is remounted read-only), mount a /proc for the new pid
namespace, then drop every capability so the candidate cannot undo any of it. Then an audit hook and an
environment trap record what the candidate tries: writes outside the box, sockets, signals, spawning
programs, looking up secrets. Records go to a pipe the parent reads; the candidate can add to them, not
take them back, nor keep them from arriving: they leave through a closure bound before any candidate code runs
(`emitter`), which checks before every write that its fd is still the pipe it was given and ends the process
(AUDIT_LOST) when it is not; swapping the code of the recorder's functions is refused and recorded.

The process that runs candidate code (the harness's runner, forked from the harness) is confined once more
(`confine_runner`): a Landlock layer of its own lets it read only the system, Python and kernelbot files it
needs plus the one module it loads, and write only in its scratch directory; reads elsewhere (other
processes' /proc entries, the parent's files, the harness's results) are refused and recorded. Landlock
also keeps it from signalling or tracing the harness, which sits outside that layer.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import site
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType, FunctionType
from typing import Any, NamedTuple

from kernelbot.packages import package_folders
from kernelbot.paths import CACHE_ENV, cache_dir

MS_RDONLY, MS_NOSUID, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP = 24
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
# Compilers a kernel's build runs; on a GPU, Triton's first compile also runs ptxas, `ldconfig -p` (to find
# libcuda) and `file` (platform.architecture), and builds its launcher with gcc or clang; torch.compile's CPU
# backend hashes its precompiled headers with `openssl sha512`.
BUILD_TOOLS = {"c++", "g++", "gcc", "cc", "clang", "nvcc", "ninja", "ld", "x86_64-linux-gnu-g++",
               "x86_64-linux-gnu-gcc", "ptxas", "ldconfig", "file", "cuobjdump", "nvdisasm", "nvlink", "fatbinary",
               "openssl"}
libc = ctypes.CDLL(None, use_errno=True)
# What the runner may read besides Python, kernelbot and its own module (everything else is refused).
SYSTEM_READABLE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
                   "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys/kernel", "/proc/sys/vm",
                   "/proc/driver/nvidia", "/proc/driver/nvidia-uvm", "/dev/null", "/dev/zero", "/dev/full",
                   "/dev/random", "/dev/urandom")
# /etc entries kept from the runner: credentials and keys.
ETC_WITHHELD = re.compile(r"^(g?shadow-?|sudoers(\.d)?|ssh|ssl|pki|security|krb5\.keytab)$|secret|token|credential|key",
                          re.IGNORECASE)
# Landlock filesystem rights that only read (landlock.py names the ones that write).
LL_EXECUTE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 2, 1 << 3
RECORDER: Recorder | None = None  # the harness's, handed to the runner it forks
# Exit status of a process an audit record could not leave: its fd closed, or another file put in its place (even
# for a moment). The harness reports a runner that ended so, and the sandbox a harness, as a violation.
AUDIT_LOST = 86
LOST_RECORDS = "audit_channel_lost"  # the violation's kind


def _mount(source: str | None, target: str, flags: int, fstype: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def lock_filesystem(box: Path) -> list[str]:
    """Read-only everything but `box`; a fresh /proc. Only valid in a private mount namespace, as root."""
    _mount(None, "/", MS_REC | MS_PRIVATE)
    _mount(str(box), str(box), MS_BIND | MS_REC)  # its own mount, so it stays writable
    _mount(None, "/", MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.chdir(box)  # the old cwd still points into the now read-only mount underneath
    done = ["filesystem read-only outside the work dir"]
    for extra in ("/tmp", "/dev/shm", "/var/tmp"):
        try:  # separate tmpfs mounts would otherwise stay writable
            if os.path.ismount(extra):
                _mount(None, extra, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            done.append(f"{extra} left writable")
    try:
        _mount("proc", "/proc", MS_NOSUID, "proc")
        done.append("own /proc")
    except OSError:
        pass
    return done


def drop_capabilities() -> None:
    """Empty the bounding set: the exec'd or current root process keeps no capability, so it cannot remount,
    load modules, trace others or change namespaces."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
            break

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.syscall(126, ctypes.byref(header), ctypes.byref(data)) != 0:  # capset
        raise OSError(ctypes.get_errno(), "capset failed")


# Bound at import, before any candidate code runs: replacing os.write or os.path.realpath later does not reach the
# recorder or the hook. All builtins (C): no code of theirs to swap.
_os_write, _fstat, _realpath, _fsdecode, _lexists, _exit = os.write, os.fstat, os.path.realpath, os.fsdecode, \
    os.path.lexists, os._exit
_quote = json.encoder.encode_basestring_ascii


class Recorder(NamedTuple):
    """Where audit records go (`fd`, a pipe the parent reads after the job), and what the process may write (`box`)
    and, in the runner, read (`readable`, prefixes). A tuple: a candidate cannot point it elsewhere. The hooks write
    through `emitter`, never through this class (which the harness's seal covers in full); closing or replacing the
    fd for good is also seen by `channel` (the runner compares it after every request)."""
    fd: int | None
    box: str
    readable: tuple[str, ...] | None = None

    def __call__(self, kind: str, detail: str) -> None:
        """One record, from trusted code (the harness's own reports)."""
        emitter(self)(kind, detail)

    def channel(self) -> tuple[int, int] | None:
        """(device, inode) of the file the records go to; None when there is none (or the fd was closed)."""
        if self.fd is None:
            return None
        try:
            st = _fstat(self.fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def outside_box(self, path) -> bool:
        try:
            p = _realpath(_fsdecode(path))
        except (TypeError, ValueError):
            return False
        box = str(self.box)
        return not (p == box or p.startswith(box + os.sep) or p in ("/dev/null", "/dev/zero"))

    def unreadable(self, path) -> bool:
        """In the runner: an existing file outside everything it may read (probing for files that are not there
        is no attempt to read anything)."""
        if self.readable is None or not isinstance(path, (str, bytes, os.PathLike)):
            return False
        try:
            p = _realpath(_fsdecode(path))
        except (TypeError, ValueError):
            return False
        inside = any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in self.readable)
        return not inside and _lexists(p)


def emitter(record: Recorder) -> Callable[[str, str], None]:
    """The one way records leave a process: a closure over `record`'s fd, the file that fd is now, and builtins
    bound at import, so that nothing a candidate can reach and put back before its call ends (the Recorder class,
    this module's names, os.write) is consulted when it writes. Before every write the fd must still be that file;
    a write that fails or would go elsewhere (the fd closed, or another file dup2'ed over it, even for a moment)
    ends the process at once with AUDIT_LOST, before the candidate could put the fd back."""
    fd, expected = record.fd, record.channel()
    write, stat, leave, quote = _os_write, _fstat, _exit, _quote

    def emit(kind: str, detail: str) -> None:
        if fd is None:
            return
        line = ('{"kind": ' + quote(kind) + ', "detail": ' + quote(detail[:300]) + "}\n").encode()
        try:
            now = stat(fd)
            if (now.st_dev, now.st_ino) == expected and write(fd, line) == len(line):
                return
        except OSError:
            pass
        leave(AUDIT_LOST)

    return emit


def lost_detail(who: str) -> str:
    """What ending with AUDIT_LOST means, for `who`."""
    return f"{who} closed or replaced its audit channel: a record it made could not reach the parent"


def lost_records(who: str) -> str:
    """Why `who` ended with AUDIT_LOST, recorded through this process's own recorder (the harness's fd, which a
    runner it forked cannot close or replace), so that the parent sees it as a violation."""
    detail = lost_detail(who)
    if RECORDER is not None:
        RECORDER(LOST_RECORDS, detail)
    return detail


def _guarded() -> tuple[Any, ...]:
    """The Recorder and every function of this module and of the Recorder: what the hooks run, whose code (set
    through `__code__`, which Python audits) no candidate may swap."""
    functions = [*globals().values(), *vars(Recorder).values()]
    return (Recorder, *(f for f in functions if isinstance(f, FunctionType) and f.__module__ == __name__))


class Harness(NamedTuple):
    """The code of the process's own harness: every code object of its modules (`code`), the code of its loop
    (`root`), from which every call into candidate code is made, and kernelbot's folders (`folders`, real paths
    ending in a separator: read before the runner's Landlock layer, which keeps it from listing their parent)."""
    code: frozenset[CodeType] = frozenset()
    root: CodeType | None = None
    folders: tuple[str, ...] = ()


def harness_code(modules: Iterable[Any], root: CodeType) -> Harness:
    """The Harness of `modules` (every code object of their functions and classes, nested ones included) run from the
    loop whose code is `root`."""
    found: set[CodeType] = set()

    def add(code: CodeType) -> None:
        if code not in found:
            found.add(code)
            for const in code.co_consts:
                if isinstance(const, CodeType):
                    add(const)

    for module in modules:
        for value in list(vars(module).values()):
            members = list(vars(value).values()) if isinstance(value, type) and value.__module__ == module.__name__ \
                else [value]
            for member in members:
                fn = getattr(member, "__func__", member)
                if isinstance(fn, FunctionType) and fn.__module__ == module.__name__:
                    add(fn.__code__)
    return Harness(frozenset(found), root, tuple(_realpath(p) + os.sep for p in package_folders()))


def _called_by_the_harness(frame: FrameType | None, harness: Harness) -> bool:
    """Whether `frame` and every frame out to the harness's loop run the harness's own code: a function the candidate
    called (one it built around the harness's code too) has the candidate's frame in between."""
    while frame is not None and frame.f_code in harness.code:
        if frame.f_code is harness.root:
            return True
        frame = frame.f_back
    return False


NO_HARNESS = Harness()  # a process that runs candidate code with no harness around it (a single-process job)


# Frames reached from other objects: the audit event of reading each (a frame from sys._getframe is audited too)
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Standard-library modules that hand the frames they read back to their caller
FRAME_GIVERS = frozenset({"inspect.py", "traceback.py"})


def asks_for_frames(frame: FrameType | None, sites: tuple[str, ...], stdlib: str, own: tuple[str, ...],
                    seen: dict[str, str] | None = None, harness: frozenset[CodeType] = frozenset()) -> str | None:
    """The file of the candidate's code that asked for a frame (`frame` asked), or None when it was other code: from
    the frame that asked outwards, past code without a file of its own (generated or frozen: whoever ran it asked) and
    past the standard library's inspect and traceback (they hand frames back), the first frame is neither the standard
    library's (warnings and logging read frames for themselves), nor an installed package's, nor kernelbot's own
    (`own`), nor the harness's (`harness`, its code objects: renamed to neutral names, they have no file of theirs)."""
    seen = {} if seen is None else seen  # file name -> its kind (the hook keeps one: no realpath per event)
    while frame is not None:
        if frame.f_code in harness:
            return None
        name = frame.f_code.co_filename
        frame = frame.f_back
        if name not in seen:
            seen[name] = _kind_of_file(name, sites, stdlib, own)
        if seen[name] not in ("generated", "giver"):
            return name if seen[name] == "candidate" else None
    return None


def _kind_of_file(name: str, sites: tuple[str, ...], stdlib: str, own: tuple[str, ...]) -> str:
    """generated (no file of its own), giver (inspect, traceback), stdlib, library (installed or kernelbot's) or
    candidate."""
    if name.startswith("<"):
        return "generated"
    path = _realpath(name)
    if path.startswith(stdlib):
        return "giver" if os.path.basename(path) in FRAME_GIVERS else "stdlib"
    return "library" if path.startswith(sites + own) else "candidate"


def install_audit(record: Recorder, harness: Harness = NO_HARNESS) -> None:
    """`harness`: the code of the harness around the candidate: it alone may set a profile or trace function (called
    from its own loop), and no function may be built around its code. The candidate's own code may not look at the
    frames that called it (the harness's: in another process the candidate is called from other code). What the hook
    calls is bound here (emit, the recorder's bound path tests, this module's helpers): replacing a name later does
    not reach it, and swapping a function's code is refused and recorded."""
    sites, stdlib = _installed_code()
    emit, outside_box, unreadable = emitter(record), record.outside_box, record.unreadable
    is_build_tool, isa_probe, fsdecode, getpid, guarded = build_tool, inductor_isa_probe, _fsdecode, os.getpid, \
        _guarded()
    called_by_harness, frames_asked, getframe = _called_by_the_harness, asks_for_frames, sys._getframe
    busy, seen = [False], {}  # the hook's own sys._getframe raises the event again: looked at once

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writing = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and isinstance(path, (str, bytes, os.PathLike)) and outside_box(path):
                emit("write_outside_workdir", f"open({fsdecode(path)!r}, {mode!r})")
            elif not writing and unreadable(path):
                emit("read_outside_box", f"open({fsdecode(path)!r}) for reading")
        elif event == "object.__setattr__" and len(args) >= 2 and any(args[0] is g for g in guarded):
            emit("audit_tamper", f"{args[0].__qualname__}.{str(args[1])[:40]} set: the audit recorder's own code")
            raise PermissionError("kernelbot sandbox: the audit recorder's code cannot be changed")
        elif event in ("sys.settrace", "sys.setprofile"):
            # a trace or profile function sees (and can rewrite) the harness's own frames
            if not called_by_harness(sys._getframe(1), harness):
                emit("introspection", f"{event}: a trace/profile function would see the harness's frames")
        elif (event == "sys._getframe" or event == "object.__getattr__" and len(args) >= 2 and
              args[1] in FRAME_ATTRIBUTES) and not busy[0] and harness.root is not None:
            busy[0] = True
            try:
                asker = frames_asked(getframe(1), sites, stdlib, harness.folders, seen, harness.code)
                if asker is not None:
                    what = event if event == "sys._getframe" else f"{type(args[0]).__name__}.{args[1]}"
                    emit("introspection", f"{what} in {asker[-80:]}: the candidate looked at the frames that called it")
            finally:
                busy[0] = False
        elif event == "function.__new__" and args and args[0] in harness.code:
            emit("audit_tamper", f"a function built around the harness's own code ({args[0].co_name[:40]})")
            raise PermissionError("kernelbot sandbox: no function may be built around the harness's code")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            emit("network", f"{event} {args[1:]!r}")
            raise PermissionError(f"kernelbot sandbox: {event} refused")
        elif event in ("os.kill", "os.killpg"):
            emit("signal", f"{event}{args!r}")
            if args and args[0] not in (0, getpid()):
                raise PermissionError(f"kernelbot sandbox: {event} refused")
        elif event in ("os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.spawn", "os.exec"):
            # subprocess starts a program by posix_spawn where it can (Triton's ptxas on a GPU node, 2026-12-04)
            if not (event in ("os.posix_spawn", "os.exec") and args and is_build_tool(args[0], outside_box)):
                emit("process", f"{event} {str(args)[:200]}")
        elif event == "subprocess.Popen":
            if not (args and is_build_tool(args[0], outside_box)) and \
                    not isa_probe(args, sys._getframe(1), sites, stdlib):
                emit("process", f"subprocess {str(args[1])[:200]}")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames"):
            emit("introspection", f"{event}: looking through the harness's objects")
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate") and args:
            if outside_box(args[0]):
                emit("write_outside_workdir", f"{event} {fsdecode(args[0])!r}")

    sys.addaudithook(hook)


def build_tool(program: object, outside_box: Callable[[Any], bool]) -> bool:
    """Whether `program` (a name or path) is one of the BUILD_TOOLS and not a file in the box (`outside_box`, the
    recorder's test), where a candidate could have written one of that name."""
    if not isinstance(program, (str, bytes, os.PathLike)):
        return False
    name = _fsdecode(program)
    return os.path.basename(name) in BUILD_TOOLS and (os.sep not in name or outside_box(name))


def _installed_code() -> tuple[tuple[str, ...], str]:
    """(installed packages' folders, the standard library's folder), each ending in a separator."""
    paths = sysconfig.get_paths()
    sites = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    return tuple(_realpath(d) + os.sep for d in sites), _realpath(paths["stdlib"]) + os.sep


def first_caller(frame: FrameType | None, stdlib: str) -> str | None:
    """The file of the first frame, from `frame` outwards, that is not the standard library's (os.environ.get,
    subprocess.run, ... are): who asked."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen "):
            path = _realpath(name)
            if not path.startswith(stdlib):
                return path
        frame = frame.f_back
    return None


def looked_up_by_a_library(frame: FrameType | None, sites: tuple[str, ...], stdlib: str) -> bool:
    """Whether the first caller outside the standard library (os.environ.get, os.getenv, ...) is code of an installed
    package: huggingface_hub reads HF_TOKEN_PATH when Liger-Kernel imports it. The candidate's module, and anything
    it writes, lies outside every installed package."""
    caller = first_caller(frame, stdlib)
    return caller is not None and caller.startswith(sites)


def inductor_isa_probe(args: tuple, frame: FrameType | None, sites: tuple[str, ...], stdlib: str) -> bool:
    """torch.compile's CPU backend checks the vector ISA by loading a library it just built in a Python child
    (torch._inductor.cpu_vec_isa): that child, started by that module with that module's own program, is a build
    step like the compiler it follows."""
    module = sys.modules.get("torch._inductor.cpu_vec_isa")
    template = getattr(getattr(module, "VecISA", None), "_avx_py_load", None)
    argv = args[1] if len(args) > 1 else None
    if not isinstance(template, str) or not isinstance(argv, (list, tuple)) or len(argv) != 3 or \
            argv[0] != sys.executable or argv[1] != "-c" or not isinstance(argv[2], str):
        return False
    head, _, tail = template.partition("__lib_path__")
    caller = first_caller(frame, stdlib)
    return argv[2].startswith(head) and argv[2].endswith(tail) and caller is not None and \
        caller.startswith(sites) and caller.endswith(os.path.join("torch", "_inductor", "cpu_vec_isa.py"))


def trap_environment(record: Recorder) -> None:
    """Looking up a secret-looking variable is recorded (the variables themselves were never passed in), unless
    an installed library does it (its own configuration, read at import: nothing of the candidate's choosing)."""
    base = type(os.environ)
    sites, stdlib = _installed_code()
    emit = emitter(record)

    class TrappedEnviron(base):  # type: ignore[misc, valid-type]
        def __getitem__(self, key):
            if isinstance(key, str) and SECRET_NAME.search(key) and \
                    not looked_up_by_a_library(sys._getframe(1), sites, stdlib):
                emit("secret_lookup", f"environment variable {key!r}")
            return base.__getitem__(self, key)

    # named as the class it stands in for: type(os.environ) naming kernelbot would tell a sandboxed run
    TrappedEnviron.__name__, TrappedEnviron.__qualname__, TrappedEnviron.__module__ = base.__name__, \
        base.__qualname__, base.__module__
    os.environ.__class__ = TrappedEnviron


def confine(box: Path, audit: bool = True, gpu: bool = False) -> list[str]:
    """Apply what this process can; return the protections now in force. With `audit` False (a harness that
    runs candidates only in a forked runner), the audit hook and environment trap are left to
    `confine_runner`. With `gpu`, the job may write what the CUDA driver writes (landlock.gpu_writable): this
    process, or with `audit` False the runner it forks, which narrows that with its own layer."""
    global RECORDER
    protections = []
    audit_fd = os.environ.pop("KERNELBOT_AUDIT_FD", None)
    record = RECORDER = Recorder(int(audit_fd) if audit_fd else None, str(box))
    if os.getpid() == 1 and os.geteuid() == 0:  # pid 1 of the namespaces unshare made for us
        protections += ["own pid namespace", "no network (own net namespace)"]
        try:
            protections += lock_filesystem(box)
        except OSError as exc:
            protections.append(f"filesystem NOT locked ({exc})")
        try:
            drop_capabilities()
            protections.append("no capabilities")
        except OSError as exc:
            protections.append(f"capabilities NOT dropped ({exc})")
    from kernelbot.sandbox.landlock import restrict

    protections += restrict(box, gpu, forks=not audit) or ["no Landlock on this kernel"]
    if audit:
        install_audit(record)
        trap_environment(record)
        protections.append("audit hook (blocks sockets and signals from Python) and environment trap")
    return protections


def readable_paths(extra: Iterable[Path]) -> list[Path]:
    """What a runner may read: the system, Python, kernelbot, the kernel library's builds, /proc of its own
    process, /etc without credentials, and `extra` (the module it loads)."""
    paths = [Path(p) for p in SYSTEM_READABLE]
    paths += [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    paths += [Path(p) for p in sys.path if p and Path(p).is_absolute()]
    paths += package_folders()
    if os.environ.get(CACHE_ENV):  # the kernel library's builds, made by the trusted parent (prebuild_library)
        paths.append(cache_dir())
    paths.append(Path(f"/proc/{os.getpid()}"))
    paths += [Path(p) for p in glob.glob("/dev/nvidia*")]
    paths += [Path("/etc") / name for name in _listdir("/etc") if not ETC_WITHHELD.search(name)]
    paths += list(extra)
    return [p for p in dict.fromkeys(paths) if os.path.lexists(p)]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def confine_runner(work: Path, extra_readable: Iterable[Path], harness: Harness, gpu: bool = False) -> list[str]:
    """In the forked runner, before candidate code loads: reads only from `readable_paths`, writes only in
    `work` (with `gpu`, also its own threads' names, which the CUDA driver sets); then the audit hook (reads
    elsewhere recorded too) and the environment trap."""
    from kernelbot.sandbox import landlock as ll

    readable = readable_paths(extra_readable)
    record = Recorder(RECORDER.fd if RECORDER else None, str(work.resolve()),
                      tuple(str(Path(p).resolve()) for p in [*readable, work]))
    protections = []
    abi = ll.abi_version()
    if abi >= 1:
        read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
        writes = ll.WRITE_FILE | ll.REMOVE_DIR | ll.REMOVE_FILE | ll.MAKE_ANY | (ll.REFER if abi >= 2 else 0) | \
            (ll.TRUNCATE if abi >= 3 else 0)
        opened_for_writing = (ll.gpu_writable() if gpu else []) + [Path("/dev/null")]
        rules = [(p, read) for p in readable] + [(work, read | writes)] + \
            [(d, read | ll.WRITE_FILE | (ll.TRUNCATE if abi >= 3 else 0)) for d in opened_for_writing]
        problem = _landlock_layer(ll, abi, read | writes, rules)
        protections.append(problem or "runner: Landlock layer of its own (reads only system, Python and kernelbot "
                                      "files and its module; writes only its scratch dir; cannot signal or trace "
                                      "the harness)")
    else:
        protections.append("runner: no Landlock on this kernel (reads are not restricted)")
    install_audit(record, harness)
    trap_environment(record)
    protections.append("audit hook (blocks sockets and signals from Python; records reads outside what it may "
                       "read, trace/profile functions and walks over the garbage collector's objects) and "
                       "environment trap")
    return protections


def _landlock_layer(ll, abi: int, handled: int, rules: list[tuple[Path, int]]) -> str | None:
    """Apply one more Landlock layer; None when it is in force, else why not."""
    file_rights = LL_EXECUTE | ll.WRITE_FILE | LL_READ_FILE | (ll.TRUNCATE if abi >= 3 else 0)
    attr = ll._Ruleset(handled, 0, 0)
    fd = libc.syscall(ll.SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if fd < 0:
        return f"runner: Landlock layer unavailable ({os.strerror(ctypes.get_errno())})"
    try:
        for path, rights in rules:
            try:
                target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                allowed = rights if os.path.isdir(path) else rights & file_rights
                rule = ll._PathBeneath(allowed, target)
                if libc.syscall(ll.SYS_ADD_RULE, fd, ll.RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)):
                    return f"runner: Landlock rule for {path} refused ({os.strerror(ctypes.get_errno())})"
            finally:
                os.close(target)
        if libc.prctl(ll.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                libc.syscall(ll.SYS_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            return f"runner: Landlock layer not applied ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    return None
