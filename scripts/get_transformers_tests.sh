#!/usr/bin/env bash
# Build a transformers tests tree (outside this repository) for tests/integration/test_transformers_common.py, which runs
# transformers' own `ModelTesterMixin` against our model classes. That test module runs this script itself, into a
# cache folder, the first time; run it by hand for a tree elsewhere:
#
#   scripts/get_transformers_tests.sh [DEST] [TRANSFORMERS_SRC]
#   HFST_TRANSFORMERS_TESTS=DEST python -m pytest -q tests/integration/test_transformers_common.py
#
# PYTHON (default: python) is the interpreter whose transformers version is fetched, with its pip.
#
# DEST (default ../transformers-tests-<version>, beside the clone) becomes the `tests/` folder of the transformers source distribution
# whose version is installed (pip download --no-binary :all:). That sdist ships tests/test_modeling_common.py but not
# the two modules it imports, tests/exporters/test_export.py (`ExportTesterMixin`, the base of `ModelTesterMixin`)
# and tests/generation/test_utils.py (`GenerationTesterMixin`):
#   - with TRANSFORMERS_SRC (a checkout of huggingface/transformers at the installed version's tag, or its tests/
#     folder's parent), those two folders are copied from it;
#   - without it, two one-line placeholder classes are written instead, so the import works: `ModelTesterMixin`'s own
#     tests all run, the export tests that `ExportTesterMixin` would add do not, and generation tests are not run
#     either way (tests/models/test_generation.py covers `generate()`).
# Nothing from transformers is copied into this repository; the tree stays where DEST says.
set -euo pipefail

src=${2:-${TRANSFORMERS_SRC:-}}
python=${PYTHON:-python}
version=$("$python" -c "import transformers; print(transformers.__version__)")
dest=${1:-../transformers-tests-$version}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-binary :all: --no-deps "transformers==$version" -d "$tmp"
tar -xzf "$tmp/transformers-$version.tar.gz" -C "$tmp" "transformers-$version/tests"

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp/transformers-$version/tests" "$dest"

if [[ -n "$src" ]]; then
  [[ -d "$src/tests/exporters" && -d "$src/tests/generation" ]] || {
    echo "$src has no tests/exporters and tests/generation" >&2
    exit 1
  }
  cp -r "$src/tests/exporters" "$src/tests/generation" "$dest/"
  origin="copied from $src ($(git -C "$src" describe --tags --always 2>/dev/null || echo 'not a git checkout'))"
else
  mkdir -p "$dest/exporters" "$dest/generation"
  printf 'class ExportTesterMixin:  # placeholder: the sdist lacks tests/exporters\n    pass\n' \
    >"$dest/exporters/test_export.py"
  printf 'class GenerationTesterMixin:  # placeholder: the sdist lacks tests/generation\n    pass\n' \
    >"$dest/generation/test_utils.py"
  origin="placeholders (no TRANSFORMERS_SRC given)"
fi
echo "transformers $version sdist tests/ -> $dest; exporters/ and generation/: $origin"
