package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		json, path string
	}{
		{`{}`, "brokers"},
		{`{"brokers":["nohost"]}`, "brokers[0]"},
		{`{"brokers":["h:1"],"sasl":{"mechanism":"GSSAPI"}}`, "sasl.mechanism"},
		{`{"brokers":["h:1"],"sasl":{"mechanism":"PLAIN","username":"u","password":"hunter2"}}`, "sasl.password"},
		{`{"brokers":["h:1"],"sasl":{"mechanism":"PLAIN","username":"u"}}`, "sasl.password_env"},
		{`{"brokers":["h:1"],"sasl":{"mechanism":"PLAIN","password_env":"P"}}`, "sasl.username"},
		{`{"brokers":["h:1"],"tls":{"enabled":true,"cert_file":"c"}}`, "tls.cert_file"},
		{`{"brokers":["h:1"],"tls":{"ca_file":"c"}}`, "tls.enabled"},
		{`{"brokers":["h:1"],"sasl":{"mechanism":"scram-sha-256","username":"u","password_env":"P"},"request_timeout":"5s"}`, ""},
	} {
		var c Config
		if err := json.Unmarshal([]byte(tc.json), &c); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if tc.path == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.json, err)
			}
			continue
		}
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.path+":") {
			t.Errorf("%s: error %v, want ErrConfig at %s", tc.json, err, tc.path)
		}
	}
}

// TestSecretsFromEnv: the password is read from the named variable when a client is built,
// and a missing variable is a config error that names it.
func TestSecretsFromEnv(t *testing.T) {
	c := Config{Brokers: []string{"127.0.0.1:1"}, SASL: &SASLConfig{Mechanism: "PLAIN", UsernameEnv: "KU", PasswordEnv: "KP"}}
	c.env = func(k string) (string, bool) { return map[string]string{"KU": "alice"}[k], k == "KU" }
	_, err := c.clientOpts()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "KP is not set") {
		t.Fatalf("missing password variable: %v", err)
	}
	c.env = func(k string) (string, bool) { return "x", true }
	if _, err := c.clientOpts(); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestCheckUnreachable(t *testing.T) {
	addr := freePort(t)
	err := Check(context.Background(), Config{Brokers: []string{addr}, RequestTimeout: Duration(time.Second)}, "t")
	if !errors.Is(err, ErrUnreachable) || !IsRetryable(err) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("got %v, want a retryable ErrUnreachable naming %s", err, addr)
	}
}

func TestCheckMissingTopic(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "present"))
	if err := Check(context.Background(), c, "present"); err != nil {
		t.Fatal(err)
	}
	err := Check(context.Background(), c, "present", "absent")
	if !errors.Is(err, ErrMissingTopic) || IsRetryable(err) || !strings.Contains(err.Error(), `"absent"`) {
		t.Fatalf("got %v, want a permanent ErrMissingTopic naming absent", err)
	}
}

// TestCheckAuth: SASL with a wrong password is ErrAuthentication; a user with no ACL on the
// topic is ErrAuthorization; with a read ACL it passes.
func TestCheckAuth(t *testing.T) {
	cl := kfake.MustCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "secret", "open"), kfake.EnableSASL(),
		kfake.EnableACLs(), kfake.Superuser("SCRAM-SHA-256", "admin", "adminpw"),
		kfake.User("PLAIN", "bob", "bobpw",
			kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "open", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true}))
	t.Cleanup(cl.Close)
	env := map[string]string{"BOB_PW": "bobpw", "WRONG": "nope"}
	base := Config{Brokers: cl.ListenAddrs(), RequestTimeout: Duration(5 * time.Second),
		env: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	bob := base
	bob.SASL = &SASLConfig{Mechanism: "PLAIN", Username: "bob", PasswordEnv: "BOB_PW"}
	if err := Check(context.Background(), bob, "open"); err != nil {
		t.Fatalf("bob on open: %v", err)
	}
	err := Check(context.Background(), bob, "secret")
	if !errors.Is(err, ErrAuthorization) || !strings.Contains(err.Error(), `"secret"`) {
		t.Fatalf("bob on secret: %v, want ErrAuthorization", err)
	}
	wrong := base
	wrong.SASL = &SASLConfig{Mechanism: "PLAIN", Username: "bob", PasswordEnv: "WRONG"}
	if err := Check(context.Background(), wrong, "open"); !errors.Is(err, ErrAuthentication) || IsRetryable(err) {
		t.Fatalf("wrong password: %v, want a permanent ErrAuthentication", err)
	}
	admin := base
	admin.SASL = &SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "admin", PasswordEnv: "ADMIN"}
	env["ADMIN"] = "adminpw"
	if err := Check(context.Background(), admin, "secret"); err != nil {
		t.Fatalf("scram superuser: %v", err)
	}
}

// newCluster starts a one-broker kfake cluster for the test and returns a Config for it.
func newCluster(t testing.TB, opts ...kfake.Opt) Config {
	t.Helper()
	_, cfg := newKfake(t, opts...)
	return cfg
}

// newKfake is newCluster that also returns the cluster, for tests that control its requests.
func newKfake(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, Config) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := Config{Brokers: c.ListenAddrs(), RequestTimeout: Duration(10 * time.Second)}
	trace(t, c, &cfg)
	return c, cfg
}

// TestSpecBlocks decodes the README's source and sink blocks (in JSON) into the connector's
// configuration, and validates them.
func TestSpecBlocks(t *testing.T) {
	var src SourceConfig
	if err := json.Unmarshal([]byte(`{"brokers":["127.0.0.1:9092"],"topics":["events"],"key_field":"user",
		"time_field":"ts","max_out_of_orderness":"5s","idle_timeout":"30s","group":"counter"}`), &src); err != nil {
		t.Fatal(err)
	}
	if err := src.Validate(); err != nil {
		t.Fatal(err)
	}
	if src.Brokers[0] != "127.0.0.1:9092" || src.KeyField != "user" || time.Duration(src.MaxOutOfOrder) != 5*time.Second || time.Duration(src.IdleTimeout) != 30*time.Second {
		t.Fatalf("%+v", src)
	}
	var sink SinkConfig
	if err := json.Unmarshal([]byte(`{"brokers":["127.0.0.1:9092"],"topic":"counts","mode":"exactly_once",
		"sasl":{"mechanism":"SCRAM-SHA-256","username":"svc","password_env":"KAFKA_PASSWORD"},"tls":{"enabled":true,"ca_file":"ca.pem"}}`), &sink); err != nil {
		t.Fatal(err)
	}
	if err := sink.Validate(); err != nil {
		t.Fatal(err)
	}
	if sink.Topic != "counts" || sink.SASL.PasswordEnv != "KAFKA_PASSWORD" || !sink.TLS.Enabled || !sink.exactlyOnce() {
		t.Fatalf("%+v", sink)
	}
}

// TestClientLoggerFromEnv: CLINK_KAFKA_LOG turns franz-go's log on at the level it names; a
// test's logger wins; anything else leaves the clients silent.
func TestClientLoggerFromEnv(t *testing.T) {
	for v, want := range map[string]kgo.LogLevel{"error": kgo.LogLevelError, "WARN": kgo.LogLevelWarn, "info": kgo.LogLevelInfo, "debug": kgo.LogLevelDebug, "": kgo.LogLevelNone, "loud": kgo.LogLevelNone} {
		c := Config{env: func(name string) (string, bool) { return v, name == logEnv }}
		got := kgo.LogLevelNone
		if l := c.clientLogger(); l != nil {
			got = l.Level()
		}
		if got != want {
			t.Errorf("%s=%q: level %v, want %v", logEnv, v, got, want)
		}
		if l, ok := c.named("sink-1").logger.(namedLogger); want != kgo.LogLevelNone && (!ok || l.name != "sink-1" || l.Level() != want) {
			t.Errorf("%s=%q: named client's logger %#v, want one naming sink-1 at %v", logEnv, v, c.named("sink-1").logger, want)
		}
	}
	tl := kgo.BasicLogger(io.Discard, kgo.LogLevelWarn, nil)
	c := Config{logger: tl, env: func(string) (string, bool) { return "debug", true }}
	if l := c.clientLogger(); l != tl {
		t.Errorf("a test's logger was replaced by the environment's: %v", l)
	}
}
