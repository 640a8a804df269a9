# Sourced by the engines' test environments (.ci/vllm_env.sh, .ci/sglang_env.sh): a venv is made anew only where the
# script that makes it or the CPU constraints changed since it was made (a stamp in the venv holds their hash).

# fresh_venv NAME VENV SCRIPT: leaves the calling script (exit 0) where VENV is up to date; else VENV is a new, empty
# venv, to be stamped (stamp_venv) once everything is in it.
fresh_venv() {
  VENV_HASH="$(cat "$3" .ci/engine_venv.sh constraints/cpu.txt | sha256sum | cut -c1-16)"
  if [ -f "$2/.kernelbot-env" ] && [ "$(cat "$2/.kernelbot-env")" = "$VENV_HASH" ]; then
    echo "$1 test environment $2 is up to date"
    exit 0
  fi
  rm -rf "$2"
  python3 -m venv "$2"
}

# stamp_venv NAME VENV: marks VENV as made by this script and these constraints.
stamp_venv() {
  echo "$VENV_HASH" > "$2/.kernelbot-env"
  echo "$1 test environment ready in $2"
}
