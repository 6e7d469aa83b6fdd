package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/clink-wasm/clink-wasm/host/connector/kafka"
)

const devUsage = `Usage: clink-wasm dev kafka [--port N] [--topic NAME:PARTITIONS]... [--data-dir DIR]

Runs a Kafka cluster (franz-go's kfake, in process, transactions included) on 127.0.0.1 until
interrupted, for trying Kafka pipelines on one machine. It prints the brokers line to paste
into a pipeline spec.
`

// cmdDev dispatches the dev subcommands (only "kafka" for now).
func cmdDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "kafka" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, devUsage)
			return errHelp
		}
		return usagef("dev: expected a subcommand: kafka\n\n%s", devUsage)
	}
	return cmdDevKafka(ctx, args[1:], stdout, stderr)
}

type topicFlags []kafka.TopicSpec

func (t *topicFlags) String() string {
	var s []string
	for _, ts := range *t {
		s = append(s, fmt.Sprintf("%s:%d", ts.Name, ts.Partitions))
	}
	return strings.Join(s, ",")
}

func (t *topicFlags) Set(v string) error {
	ts, err := kafka.ParseTopicSpec(v)
	if err != nil {
		return err
	}
	*t = append(*t, ts)
	return nil
}

func cmdDevKafka(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dev kafka", "dev kafka [--port N] [--topic NAME:PARTITIONS]... [--data-dir DIR]", stderr)
	var topics topicFlags
	port := fs.Int("port", kafka.DefaultDevPort, "port to listen on, on 127.0.0.1 (0 picks a free one)")
	brokers := fs.Int("brokers", 1, "number of brokers (ports PORT, PORT+1, ...)")
	dataDir := fs.String("data-dir", "", "keep the cluster's data in this directory across restarts (default: in memory)")
	fs.Var(&topics, "topic", "create a topic, NAME:PARTITIONS (repeatable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("dev kafka: unexpected argument %q", fs.Arg(0))
	}
	if *port < 0 || *port > 65535 {
		return usagef("dev kafka: --port %d is not a port", *port)
	}
	if *brokers < 1 || *brokers > 16 {
		return usagef("dev kafka: --brokers must be from 1 to 16")
	}
	d, err := kafka.StartDev(kafka.DevOptions{Port: *port, Brokers: *brokers, Topics: topics, DataDir: *dataDir})
	if err != nil {
		return fmt.Errorf("%w (is another Kafka running there? try --port)", err)
	}
	defer d.Close()
	quoted := make([]string, 0, len(d.Brokers()))
	for _, b := range d.Brokers() {
		quoted = append(quoted, fmt.Sprintf("%q", b))
	}
	fmt.Fprintf(stderr, "dev kafka: %d broker(s) on loopback, topics: %s; Ctrl-C stops it (data is lost unless --data-dir)\n",
		*brokers, topicList(topics))
	fmt.Fprintf(stdout, "brokers: [%s]\n", strings.Join(quoted, ", "))
	<-ctx.Done()
	fmt.Fprintln(stderr, "dev kafka: stopping")
	return nil
}

func topicList(t topicFlags) string {
	if len(t) == 0 {
		return "none (create them with --topic NAME:PARTITIONS)"
	}
	return t.String()
}
