#!/usr/bin/env bash
# Coverage-guided fuzzing of the library with cargo fuzz (libFuzzer): every target of
# fuzz/fuzz_targets/ (fuzz/README.md says what each checks) runs for --seconds (default 60),
# starting from its committed corpus fuzz/corpus/<target>/. Installs cargo-fuzz when missing.
# Exit 0 only when no target crashed, failed an assertion, leaked, ran out of memory or hung.
#
#   scripts/fuzz.sh [--seconds N] [--target NAME]... [-- LIBFUZZER_ARGS...]
#
# cargo fuzz needs nightly rustc flags (-Zsanitizer=address); RUSTC_BOOTSTRAP=1 lets the pinned
# stable toolchain take them. The build keeps cargo fuzz's defaults: release optimizations with
# debug assertions and overflow checks, and AddressSanitizer.
#
# New inputs a run finds go to fuzz/target/corpus-new/<target>/ (the committed corpus is only
# read); a crashing input is written to fuzz/artifacts/<target>/, and the command to replay it
# is printed. To grow the committed corpus, run a target longer and minimize it into place:
#   RUSTC_BOOTSTRAP=1 cargo fuzz cmin <target>   (in fuzz/)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT/fuzz"
die() {
    echo "fuzz: $*" >&2
    exit 1
}

CARGO_FUZZ_VERSION=0.13.2
seconds=60
targets=()
extra=()
while (($#)); do
    case $1 in
    --seconds)
        [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--seconds needs a positive number"
        seconds=$2
        shift 2
        ;;
    --target)
        [[ -n ${2:-} ]] || die "--target needs a name"
        targets+=("$2")
        shift 2
        ;;
    --)
        shift
        extra=("$@")
        break
        ;;
    *) die "unknown argument $1 (usage: scripts/fuzz.sh [--seconds N] [--target NAME]... [-- ARGS])" ;;
    esac
done

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

# cargo fuzz has no --locked: check that fuzz/Cargo.lock needs no change before building.
cargo metadata --locked --format-version 1 >/dev/null ||
    die "fuzz/Cargo.lock is out of date: run cargo update --workspace in fuzz/ and commit it"

all=()
while read -r name; do
    all+=("$name")
done < <(cargo fuzz list)
((${#all[@]})) || die "cargo fuzz list found no target"
if ((${#targets[@]} == 0)); then
    targets=("${all[@]}")
fi
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || die "no fuzz target $t (targets: ${all[*]})"
done

echo "fuzz: building ${#all[@]} targets"
cargo fuzz build

failed=()
for t in "${targets[@]}"; do
    [[ -d corpus/$t ]] || die "fuzz/corpus/$t is missing: every target has a committed corpus"
    new=target/corpus-new/$t
    log=target/fuzz-logs/$t.log
    mkdir -p "$new" "artifacts/$t" target/fuzz-logs
    echo
    echo "=== fuzz $t: ${seconds}s (full output: fuzz/$log) ==="
    # -timeout: one input taking 30 s is a hang; -rss_limit_mb: libFuzzer's default, made explicit.
    if cargo fuzz run "$t" "$new" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        "${extra[@]}" >"$log" 2>&1; then
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
        echo "fuzz: $t: no crash in ${seconds}s"
    else
        failed+=("$t")
        tail -n 80 "$log"
        echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/; replay it with"
        echo "    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t artifacts/$t/<file>)"
    fi
done

echo
if ((${#failed[@]})); then
    die "${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}"
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
