#!/usr/bin/env bash
# Stop the server started by scripts/s3-up.sh and remove its data.
# Usage: scripts/s3-down.sh   (reads CLINK_TEST_S3_PID and CLINK_TEST_S3_DIR from the environment)
set -uo pipefail
if [[ -n ${CLINK_TEST_S3_PID:-} ]]; then
	kill "$CLINK_TEST_S3_PID" 2>/dev/null
	for ((i = 0; i < 50; i++)); do kill -0 "$CLINK_TEST_S3_PID" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$CLINK_TEST_S3_PID" 2>/dev/null
fi
if [[ -n ${CLINK_TEST_S3_DIR:-} && $CLINK_TEST_S3_DIR == /tmp/clink-s3.* ]]; then
	rm -rf "$CLINK_TEST_S3_DIR"
fi
exit 0
