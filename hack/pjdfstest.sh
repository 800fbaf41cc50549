#!/usr/bin/env bash
# Builds pjdfstest, the POSIX file system conformance suite, from its source tree
# (PJDFSTEST_SRC, default ../shared/tools/pjdfstest; never built in place) into
# $SLUICE_CACHE/pjdfstest-<hash of the source>, and prints that directory: it holds the
# pjdfstest binary and the suite's tests/, ready for `prove -r DIR/tests`.
#
# No autotools: configure.ac only asks which functions, headers and stat members exist,
# so this script writes the config.h that `./configure` would, each HAVE_<func> set when
# a program calling the function links and the C library does not mark it as a stub (as
# autoconf's AC_CHECK_FUNC tests).
#
# Exit status: 0 built or cached; 3 no source at PJDFSTEST_SRC; other: the build failed.
set -euo pipefail
cd "$(dirname "$0")/.."

src=${PJDFSTEST_SRC:-../shared/tools/pjdfstest}
if [ ! -f "$src/pjdfstest.c" ] || [ ! -d "$src/tests" ]; then
  echo "pjdfstest: no source at PJDFSTEST_SRC=$src (expected pjdfstest.c and tests/); set PJDFSTEST_SRC to a pjdfstest checkout" >&2
  exit 3
fi
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
hash=$(cd "$src" && find . -type f ! -path './.git/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
out="$cache/pjdfstest-$hash"
if [ -x "$out/pjdfstest" ] && [ -d "$out/tests" ]; then
  echo "$out"
  exit 0
fi
echo "pjdfstest: building from $src into $out" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$src/." "$work/"
chmod -R u+w "$work"

probe() { # name: does a program calling name() link, and is it no stub?
  cat >"$work/probe.c" <<C
#define _GNU_SOURCE 1
#include <gnu/stubs.h>
#if defined __stub_$1 || defined __stub___$1
#error stub
#endif
char $1(void);
int main(void) { return $1(); }
C
  cc -o "$work/probe" "$work/probe.c" >/dev/null 2>&1
}
header() { printf '#include <%s>\nint main(void){return 0;}\n' "$1" >"$work/probe.c" && cc -c -o "$work/probe.o" "$work/probe.c" >/dev/null 2>&1; }
member() { # struct stat member
  printf '#include <sys/types.h>\n#include <sys/stat.h>\nint main(void){struct stat s; (void)sizeof(s.%s); return 0;}\n' "$1" >"$work/probe.c" &&
    cc -c -o "$work/probe.o" "$work/probe.c" >/dev/null 2>&1
}
upper() { tr '[:lower:]/.' '[:upper:]__' <<<"$1"; }

{
  echo '/* config.h written by hack/pjdfstest.sh, as configure would */'
  echo '#define _GNU_SOURCE 1'
  echo '#define _ALL_SOURCE 1'
  echo '#define _POSIX_PTHREAD_SEMANTICS 1'
  for f in bindat chflags chflagsat connectat faccessat fchflags fchmodat fchownat fstatat \
    lchflags lchmod linkat lpathconf mkdirat mkfifoat mknodat openat posix_fallocate \
    readlinkat renameat symlinkat utimensat; do
    if probe "$f"; then echo "#define HAVE_$(upper "$f") 1"; fi
  done
  for h in sys/mkdev.h sys/sysmacros.h; do
    if header "$h"; then echo "#define HAVE_$(upper "$h") 1"; fi
  done
  for m in st_atim st_atimespec st_birthtim st_birthtime st_birthtimespec st_ctim st_ctimespec st_mtim st_mtimespec; do
    if member "$m"; then echo "#define HAVE_STRUCT_STAT_$(upper "$m") 1"; fi
  done
} >"$work/config.h"
cc -O2 -Wall -I"$work" -o "$work/pjdfstest" "$work/pjdfstest.c"

mkdir -p "$cache"
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
cp "$work/pjdfstest" "$work/config.h" "$out.tmp/"
cp -R "$work/tests" "$out.tmp/tests"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
