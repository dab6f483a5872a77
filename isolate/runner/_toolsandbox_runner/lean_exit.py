"""The end of a tool's or a script's process as a program ends, without
the interpreter's teardown: non-daemon threads joined, atexit handlers
run, stdio and the file objects left open for writing flushed, _exit.

It imports nothing of the package and only modules the interpreter has
built in or frozen: a cold script's launcher (daemon/compile/spawn_policy.cc,
script_launcher) imports it with the runner's directory as the whole of
sys.path, so that nothing of the run's working directory can stand in."""

import os
import stat
import sys

_end_note = None  # the end note (_take_end_note): (fd, pid, (st_dev, st_ino), fd bound)


def _take_end_note():
    """fd 3 of a warm sandbox or a script run: the end note, a pipe to pid 1
    (isolate/init/init.cc). Moved to a close-on-exec descriptor, so that no
    program the tool runs inherits it, before the tool's or the script's
    code runs (a per-tool venv's .pth files run earlier, at the
    interpreter's start);
    kept with this process's pid (a process the tool forks ends as a cold
    one, without a note: its note would end the whole run) and the pipe's
    identity (a tool that closed it and opened a file under its number
    gets no byte in that file)."""
    global _end_note
    try:
        st = os.fstat(3)
    except OSError:
        return
    if not stat.S_ISFIFO(st.st_mode):
        return
    fd = os.dup(3)  # Python's descriptors are close-on-exec
    os.close(3)
    # RLIMIT_NOFILE: every descriptor is below it. init set its soft and
    # hard limits alike, and nothing that runs before this (the
    # interpreter's start, a venv's .pth files) has a reason to change
    # them, so the soft one (sysconf) is the hard one; a lower one only
    # leaves a descriptor above it open until the run's end.
    limit = os.sysconf("SC_OPEN_MAX")
    bound = limit if 0 < limit < (1 << 20) else 1 << 20
    _end_note = (fd, os.getpid(), (st.st_dev, st.st_ino), bound)


def _exit(code):
    """os._exit(code); in the process that took the end note, with the note
    still where it was, first every other descriptor closed (the daemon's
    readers see the end of stdout and stderr now) and the status written
    on it: the run ends there, not once the kernel has torn this process's
    memory down (a millisecond and more). A program the tool started and
    left running holds its own copies and ends with the run, as it would
    at this process's exit."""
    if _end_note is not None and _end_note[1] == os.getpid():
        fd, _, ident, bound = _end_note
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ident:
                os.closerange(0, fd)
                os.closerange(fd + 1, max(fd + 1, bound))
                os.write(fd, bytes([code & 0xFF]))
        except OSError:
            pass
    os._exit(code)


def _flush_std():
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:
            pass


def _watch_written_files():
    """A flag set once the tool opens a file object for writing (the "open"
    audit event of io.open, the only kind with a buffer of its own): then,
    and only then, _lean_exit looks for open file objects to flush."""
    opened = [False]

    def hook(event, args):
        if event == "open" and not opened[0] and len(args) > 1 and isinstance(args[1], str) and any(
            c in args[1] for c in "wax+"
        ):
            opened[0] = True

    sys.addaudithook(hook)
    return opened


def _flush_files():
    """Flush every open file object, as the interpreter's teardown would
    have when it finalized them: data a tool wrote to a file it never
    closed (a module-level log in a writable bind) is not lost."""
    import gc
    import io

    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:
                pass


def _lean_exit(code, source_file, files_opened):
    """The end of the tool's process, as the end of Letta's script without
    the interpreter's teardown: non-daemon threads joined, atexit handlers
    run, stdio and (when the tool opened any for writing) every open file
    object flushed; then the source file removed and _exit. What the
    teardown also did and this does not: run __del__ of objects still alive
    (which Python does not promise at exit either). A tool that ends the
    process itself, with os._exit, leaves its source file in the run's
    working directory, a tmpfs of its own that ends with the run."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    if files_opened[0]:
        _flush_files()
    _flush_std()
    if source_file is not None:
        try:
            os.unlink(source_file)
        except OSError:
            pass
    _exit(code)


def _watch_script():
    """From here on the script's: the file objects it opens for writing are
    watched (_watch_written_files). Returns the script's end."""
    files_opened = _watch_written_files()
    return lambda: _script_end(files_opened)


def _script_start():
    """A cold script's launcher, just before the script: the end note taken,
    as a warm sandbox's hand-over takes it (a descriptor it cannot copy
    leaves the note where it is: the run then ends at the process's exit);
    returns the script's end."""
    try:
        _take_end_note()
    except OSError:
        pass
    return _watch_script()


def _script_end(files_opened):
    """A script, warm or cold, that ran to its end: the end of a Python
    program (what Py_FinalizeEx does that a program can see: non-daemon
    threads joined, atexit handlers run, stdio and every file object left
    open for writing flushed), then _exit(0) without the interpreter's
    teardown (freeing every module: 3-4 ms of a Letta script's 23, and
    longer for a warm one, whose hand-over loaded more). What it skips:
    __del__ of objects still alive, which Python does not promise at exit
    either, and flushing what C code left in C stdio's buffers of files it
    opened (stdout and stderr are unbuffered under -u or PYTHONUNBUFFERED,
    which the shipped policies set). A script that raises, or calls
    sys.exit, never gets here: the interpreter ends it with the full
    teardown, the traceback and the status of a bare run; so does one
    whose stdio cannot be flushed (the interpreter then reports that, with
    status 120)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass  # as the interpreter's teardown, which ignores it
    try:
        import atexit

        atexit._run_exitfuncs()  # reports a handler's exception itself, as at the interpreter's exit
    except BaseException:
        pass
    if files_opened[0]:
        _flush_files()
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None:
                f.flush()
        except BaseException:
            return  # the interpreter's own exit reports it
    _exit(0)
