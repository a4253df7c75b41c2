"""How the command-line programs end: their exit status is the status their ``main`` returned, never a
signal raised while the interpreter tears itself down.

Why not a plain ``sys.exit(main())``: by the time ``main`` returns, native threads that Python does not own
are still alive -- pyarrow's C++ CPU and I/O thread pools (``std::thread`` workers), deltalake's tokio
runtime, jemalloc's background threads, OpenBLAS's servers. A pyarrow dataset read through a Python file
system (the Delta tables are read that way: ``deltalake``'s ``DeltaStorageHandler`` wrapped in
``pyarrow.fs.PyFileSystem``, ``pre_buffer=True``) runs ``PyReadableFile::ReadAt`` / ``Close`` and drops Python
file objects on an I/O-pool thread, taking the GIL there. If such a task is still queued or running when the
main thread enters ``Py_FinalizeEx``, the worker tries to take the GIL of a finalizing interpreter and is
ended with ``pthread_exit``; the forced unwind meets the ``noexcept`` frame of the ``std::thread`` body and
libstdc++ calls ``std::terminate`` ("terminate called without an active exception", SIGABRT, exit 134), or
CPython aborts with ``PyGILState_Release: thread state ... must be current``. The work was done; the status
says it failed.

:func:`run` ends the process in a controlled order instead:

1. the program's Python threads that are not daemons are joined (what a normal exit does first);
2. the ``atexit`` handlers run (e.g. ``txlog_io.readstats.flush``, logging's shutdown, multiprocessing's
   clean-up of its children);
3. ``sys.stdout`` and ``sys.stderr`` are flushed (a closed pipe on stdout is not an error: the reader has
   gone, as ``head`` does; another flush error turns a 0 into 120, as CPython's own exit does);
4. ``os._exit(code)``: the kernel ends every thread at once; no native thread gets to run inside a
   half-finalized interpreter, and no C++ static destructor joins or terminates a pool.

Nothing the programs write is left to the teardown: Delta commits, store copies and report files are
complete when ``main`` returns, files are closed by their ``with`` blocks, and the output streams are flushed
in step 3.  No ``gc.collect()`` first: collecting an abandoned scan on this thread could wait for the very
I/O tasks that need the GIL it holds; such objects are never finalized, the kernel frees their memory.

Tests call ``main(argv)`` in-process and get its return value; only the entry points (``if __name__ ==
"__main__"`` and the console scripts) go through :func:`run`.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from typing import Callable, NoReturn, Optional

#: the status CPython itself uses when flushing the standard streams fails at exit
EXIT_FLUSH_FAILED = 120


def exit_code(value) -> int:
    """The status ``sys.exit(value)`` would give: None is 0, an int is itself (mod 256 by the kernel),
    anything else is printed to stderr and gives 1."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001 - stderr itself is gone: the status still says it failed
        pass
    return 1


def _join_threads() -> None:
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon and t is not threading.current_thread():
            t.join()


def _flush(code: int) -> int:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            pass                    # nobody reads any more (``| head``): not the program's failure
        except (OSError, ValueError):
            if code == 0:
                code = EXIT_FLUSH_FAILED
    return code


def finish(value=0) -> NoReturn:
    """End the process with the status of ``value`` (see the module docstring for the order)."""
    code = exit_code(value)
    try:
        _join_threads()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - an exit handler failing must not hide the program's status
        traceback.print_exc()
    os._exit(_flush(code))


def run(main: Callable[..., Optional[int]], *args) -> NoReturn:
    """``finish(main(*args))``, with what escapes ``main`` turned into the status a normal exit gives:
    ``SystemExit`` its code, ``KeyboardInterrupt`` 130, any other exception its traceback and 1."""
    value: object
    try:
        value = main(*args)
    except SystemExit as e:
        value = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        value = 130
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then status 1
        traceback.print_exc()
        value = 1
    finish(value)


__all__ = ["run", "finish", "exit_code", "EXIT_FLUSH_FAILED"]
