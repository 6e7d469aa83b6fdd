package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/clink-wasm/clink-wasm/host/state"
)

// poolRecords keeps a job's checkpoint records as objects of the state pool itself (s3://),
// next to the state they name. Create-once is the pool's conditional create (S3
// If-None-Match: *), so a record's existence is its commit point on S3 as a linked file is
// on file://, and a zombie writer (a scale-out worker that lost its partition) cannot
// overwrite a record the new owner wrote.
type poolRecords struct{ o *state.Objects }

// openJobRecords returns the record store of a job: file:// and mem:// as openRecordStore
// does, and s3:// (or any pool) through the job's state store.
func openJobRecords(st *state.Store, stateURL, tenant, job string) (recordStore, error) {
	u, err := url.Parse(stateURL)
	if err != nil {
		return nil, fmt.Errorf("state URL: %w", err)
	}
	if u.Scheme != "s3" || st == nil {
		return openRecordStore(stateURL, tenant, job)
	}
	t := tenant
	if t == "" {
		t = "_"
	}
	return &poolRecords{o: st.Objects("jobs/" + url.PathEscape(t) + "/" + url.PathEscape(job))}, nil
}

func (p *poolRecords) ClaimAttempt(ctx context.Context) (uint64, error) {
	for range 100 {
		ids, err := p.list(ctx, "attempts", "")
		if err != nil {
			return 0, err
		}
		next := uint64(1)
		if len(ids) > 0 {
			next = ids[len(ids)-1] + 1
		}
		err = p.o.Create(ctx, "attempts/"+strconv.FormatUint(next, 10), []byte(time.Now().UTC().Format(time.RFC3339Nano)))
		if errors.Is(err, state.ErrExists) {
			continue // another attempt claimed it first
		}
		if err != nil {
			return 0, fmt.Errorf("claiming an attempt: %w", err)
		}
		return next, nil
	}
	return 0, errors.New("claiming an attempt: too much contention")
}

func (p *poolRecords) Put(ctx context.Context, kind string, rec *CheckpointRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	err = p.o.Create(ctx, kind+"/"+recordName(rec.ID), append(b, '\n'))
	if errors.Is(err, state.ErrExists) {
		return fmt.Errorf("%s %d: %w", kind, rec.ID, ErrRecordExists)
	}
	return err
}

func (p *poolRecords) Get(ctx context.Context, kind string, id uint64) (*CheckpointRecord, error) {
	b, err := p.o.Get(ctx, kind+"/"+recordName(id))
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("checkpoint %d: %w", id, ErrNoCheckpoint)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint record %d: %w", id, err)
	}
	return decodeRecord(b, id)
}

func (p *poolRecords) List(ctx context.Context, kind string) ([]uint64, error) {
	return p.list(ctx, kind, ".json")
}

func (p *poolRecords) list(ctx context.Context, kind, suffix string) ([]uint64, error) {
	names, err := p.o.List(ctx, kind+"/")
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, n := range names {
		n, ok := strings.CutSuffix(strings.TrimPrefix(n, kind+"/"), suffix)
		if !ok || strings.Contains(n, "/") {
			continue
		}
		if id, err := strconv.ParseUint(n, 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func (p *poolRecords) Delete(ctx context.Context, kind string, id uint64) error {
	return p.o.Delete(ctx, kind+"/"+recordName(id))
}
