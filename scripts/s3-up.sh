#!/usr/bin/env bash
# Start an S3-compatible server (versitygw, posix backend) on loopback for the state tests.
#
# Usage:
#   eval "$(scripts/s3-up.sh)"        # start, create the bucket, export the test variables
#   go test ./host/state/...          # S3 tests now run against it
#   scripts/s3-down.sh                # stop it and remove its data (uses CLINK_TEST_S3_PID/DIR)
#
# It prints only `export` lines on stdout (diagnostics go to stderr):
#   CLINK_TEST_S3_ENDPOINT  http://127.0.0.1:<port>
#   CLINK_TEST_S3_BUCKET    the bucket it created
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION   credentials for the standard chain
#   CLINK_TEST_S3_PID, CLINK_TEST_S3_DIR                   for scripts/s3-down.sh
#
# Knobs (environment): S3_PORT (default: a free port from 17070), S3_DIR (default: mktemp -d),
# S3_BUCKET (default clink-test), VERSITYGW (default: $(go env GOPATH)/bin/versitygw, installed
# with `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0` when missing).
set -euo pipefail

log() { echo "s3-up: $*" >&2; }

VERSION=v1.8.0
VGW=${VERSITYGW:-$(go env GOPATH)/bin/versitygw}
if [[ ! -x $VGW ]]; then
	log "installing versitygw $VERSION"
	GOFLAGS= go install "github.com/versity/versitygw/cmd/versitygw@$VERSION" >&2
fi

ACCESS=clinkaccess
SECRET=clinksecret123
REGION=us-east-1
BUCKET=${S3_BUCKET:-clink-test}
DIR=${S3_DIR:-$(mktemp -d /tmp/clink-s3.XXXXXX)}
mkdir -p "$DIR/root"

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=${S3_PORT:-}
if [[ -z $PORT ]]; then
	for ((p = 17070; p < 17170; p++)); do
		if ! port_busy "$p"; then PORT=$p; break; fi
	done
	[[ -n $PORT ]] || { log "no free port in 17070-17169"; exit 1; }
fi

# Loopback only. Keep-alive as S3 itself does: without it versitygw closes every connection
# after one response, so each request pays a TCP connect and the client and server CPU that goes
# with it (about half of each GET's CPU in issue 10's benchmark). S3_KEEPALIVE=false turns it off.
KEEPALIVE=()
[[ ${S3_KEEPALIVE:-true} == true ]] && KEEPALIVE=(--keep-alive)
nohup "$VGW" --access "$ACCESS" --secret "$SECRET" --region "$REGION" --quiet "${KEEPALIVE[@]}" \
	--port "127.0.0.1:$PORT" posix "$DIR/root" >"$DIR/versitygw.log" 2>&1 </dev/null &
PID=$!
ENDPOINT="http://127.0.0.1:$PORT"

# Wait (bounded: 30 s) until it answers HTTP.
for ((i = 0; i < 300; i++)); do
	if ! kill -0 "$PID" 2>/dev/null; then
		log "versitygw exited; log follows"; cat "$DIR/versitygw.log" >&2; exit 1
	fi
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$ENDPOINT/" || true)
	if [[ $code != 000 ]]; then break; fi
	sleep 0.1
done
if [[ ${code:-000} == 000 ]]; then
	log "versitygw did not answer on $ENDPOINT"; kill "$PID" 2>/dev/null || true; exit 1
fi

# Create the bucket (SigV4-signed PUT); 409 means it exists already.
code=$(curl -s -o "$DIR/create.out" -w '%{http_code}' --max-time 10 -X PUT \
	-H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
	--aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS:$SECRET" "$ENDPOINT/$BUCKET")
if [[ $code != 200 && $code != 409 ]]; then
	log "create bucket $BUCKET: HTTP $code"; cat "$DIR/create.out" >&2
	kill "$PID" 2>/dev/null || true; exit 1
fi
log "versitygw $VERSION pid $PID on $ENDPOINT, bucket $BUCKET, data in $DIR"

cat <<OUT
export CLINK_TEST_S3_ENDPOINT=$ENDPOINT
export CLINK_TEST_S3_BUCKET=$BUCKET
export AWS_ACCESS_KEY_ID=$ACCESS
export AWS_SECRET_ACCESS_KEY=$SECRET
export AWS_REGION=$REGION
export CLINK_TEST_S3_PID=$PID
export CLINK_TEST_S3_DIR=$DIR
OUT
