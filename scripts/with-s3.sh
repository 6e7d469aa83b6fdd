#!/usr/bin/env bash
# Run a command with the loopback S3 test server (versitygw) up, then stop it.
#   scripts/with-s3.sh go test ./...
# If CLINK_TEST_S3_ENDPOINT is already set (CI started the server), it just runs the command.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ -n "${CLINK_TEST_S3_ENDPOINT:-}" ]]; then
	exec "$@"
fi
eval "$("$here/s3-up.sh")"
trap '"$here/s3-down.sh" >/dev/null 2>&1 || true' EXIT
"$@"
