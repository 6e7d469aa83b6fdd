package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// TaskName is the job name of partition p's task: its checkpoint records, state, and sink
// transactional IDs derive from it, so that they belong to the partition, not to a worker.
func TaskName(job string, p int32) string { return fmt.Sprintf("%s-p%05d", job, p) }

// maxJobName leaves room in a job name (64 characters at most) for TaskName's suffix.
const maxJobName = 64 - len("-p00000")

// PartitionURL returns the state pool of partition p's task under base: BASE/HH/TASK, where HH
// is two hex digits of sha256("JOB/p"). The hash comes first so that partitions spread evenly
// over 256 S3 prefixes (S3's request-rate limits are per prefix; docs/SCALING.md).
func PartitionURL(base, job string, p int32) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("state URL: %w", err)
	}
	switch u.Scheme {
	case "s3", "file", "mem":
	default:
		return "", fmt.Errorf("state URL %q: want s3://, file:// or mem://", redact(u))
	}
	h := sha256.Sum256([]byte(job + "/" + strconv.Itoa(int(p))))
	u.Path = path.Join("/", u.Path, hex.EncodeToString(h[:1]), TaskName(job, p))
	if u.Scheme == "s3" || u.Scheme == "mem" {
		// s3://bucket/prefix and mem://name/...: the path is a key prefix, not a file path.
		u.Path = path.Clean(u.Path)
	}
	return u.String(), nil
}

func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	return c.String()
}

// clusterRecord is created once per job under BASE/cluster/: the topic's partition count and
// the key groups per partition are fixed for the life of the job's state, since Kafka's
// partitioner (key → partition) depends on the count.
type clusterRecord struct {
	Format     string `json:"format"`
	Job        string `json:"job"`
	Topic      string `json:"topic"`
	Partitions int32  `json:"partitions"`
	KeyGroups  int    `json:"key_groups"`
}

const clusterFormat = "clink-cluster/1"

// ErrLayoutChanged refuses a worker whose topic's partition count (or key groups) differs
// from the one the job's state was created with.
var ErrLayoutChanged = errors.New("cluster: the job's partition layout changed")

// checkLayout creates the job's cluster record, or checks the existing one matches.
func checkLayout(ctx context.Context, base string, want clusterRecord) error {
	st, err := state.Open(ctx, base)
	if err != nil {
		return fmt.Errorf("state pool: %w", err)
	}
	defer st.Close()
	want.Format = clusterFormat
	b, _ := json.Marshal(want)
	objs := st.Objects("cluster")
	name := url.PathEscape(want.Job) + ".json"
	err = objs.Create(ctx, name, b)
	if err == nil {
		return nil
	}
	if !errors.Is(err, state.ErrExists) {
		return fmt.Errorf("cluster record: %w", err)
	}
	old, err := objs.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("cluster record: %w", err)
	}
	var have clusterRecord
	if err := json.Unmarshal(old, &have); err != nil {
		return fmt.Errorf("cluster record %s is corrupt: %w", name, err)
	}
	if have.Topic != want.Topic || have.Partitions != want.Partitions || have.KeyGroups != want.KeyGroups {
		return fmt.Errorf("%w: job %s was created over topic %q with %d partitions and %d key groups each; now topic %q has %d and the spec %d key groups (a changed partition count moves keys between partitions: start a new job)",
			ErrLayoutChanged, want.Job, have.Topic, have.Partitions, have.KeyGroups, want.Topic, want.Partitions, want.KeyGroups)
	}
	return nil
}
