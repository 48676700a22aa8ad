"""cffi builder for ``trio_ha._native`` (out-of-line API mode).

setup.py names this module in ``cffi_modules``, so ``pip install`` compiles the C core into the
package. The header is the single source of the interface: cdef reads it with the #include and
#define-of-expressions lines dropped, since cffi's parser only takes declarations.

The C core is one file per concern (hash.c, encode.c, scan.c, consume_queue.c, index.c, files.c,
transfer.c) compiled as ONE translation unit: trio_ha_native.c includes them, and it is the only
source named here. Not ``sources=[every part]``, because the hot paths cross parts -- the
encoders and the scanner call th_crc32, th_gather calls the record parser -- and as separate
units those calls could no longer be inlined without link-time optimisation, a change of flags
and of the code the put and scan paths run. As one unit the module compiles to the same machine
code as when the parts were one file, its internal helpers stay static (nothing exported but
the th_* calls) and it is still one extension module, as the design card wants. ``depends``
names the parts, so a build directory that is reused recompiles when any of them changes.
"""

import os
import pathlib
import re

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
HEADER = (HERE / "trio_ha_native.h").read_text()


def _rel(path: pathlib.Path) -> str:
    # setuptools rejects absolute source paths; pip builds from the project root, so this is
    # "native/..." there, and still right when the script is run from anywhere else.
    return os.path.relpath(path, os.getcwd())


def _cdef_text(header: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    lines = [line for line in text.splitlines() if not line.startswith("#include")]
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text(HEADER))
ffibuilder.set_source(
    "trio_ha._native",
    '#include "trio_ha_native.h"',
    sources=[_rel(HERE / "trio_ha_native.c")],
    depends=[_rel(path) for path in sorted(HERE.glob("*.[ch]"))],
    include_dirs=[_rel(HERE)],
    libraries=["z"],
    extra_compile_args=["-O3", "-std=gnu11", "-pthread", "-Wall", "-Wextra",
                        "-Werror=implicit-function-declaration"],
    extra_link_args=["-pthread"],  # the sync thread (th_sync_thread_*)
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
