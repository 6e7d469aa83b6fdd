package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Config is how to reach a cluster: the part of a pipeline spec's Kafka source or sink that
// is the same for both. It holds no secret: SASL passwords (and, if wanted, user names) are
// read from environment variables that the spec names, when a client is built.
type Config struct {
	Brokers  []string    `json:"brokers" yaml:"brokers"`
	ClientID string      `json:"client_id,omitempty" yaml:"client_id,omitempty"`
	SASL     *SASLConfig `json:"sasl,omitempty" yaml:"sasl,omitempty"`
	TLS      *TLSConfig  `json:"tls,omitempty" yaml:"tls,omitempty"`
	// RequestTimeout bounds how long a request (connect, metadata, produce, commit) is
	// retried before the operation fails with a classified error. Zero means 30s. A broker
	// that is away for less than this is ridden out; longer, and the caller gets
	// ErrUnreachable (retryable) and its restart strategy decides.
	RequestTimeout Duration `json:"request_timeout,omitempty" yaml:"request_timeout,omitempty"`

	// dial replaces the dialer; tests use it to inject network faults around the real client.
	dial func(ctx context.Context, network, host string) (net.Conn, error)
	// env replaces os.LookupEnv in tests.
	env func(string) (string, bool)
	// logger, if set, receives the clients' logs (tests capture franz-go's debug log and
	// print it when they fail).
	logger kgo.Logger
}

// SASLConfig selects a mechanism and names where the credentials come from.
type SASLConfig struct {
	Mechanism   string `json:"mechanism" yaml:"mechanism"` // PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	Username    string `json:"username,omitempty" yaml:"username,omitempty"`
	UsernameEnv string `json:"username_env,omitempty" yaml:"username_env,omitempty"`
	PasswordEnv string `json:"password_env" yaml:"password_env"`
	// Password exists only so that a spec that carries one is refused with a clear error
	// instead of being silently accepted or ignored.
	Password string `json:"password,omitempty" yaml:"password,omitempty"`
}

// TLSConfig turns TLS on. Files are PEM. Without CAFile the system roots are used.
type TLSConfig struct {
	Enabled            bool   `json:"enabled" yaml:"enabled"`
	CAFile             string `json:"ca_file,omitempty" yaml:"ca_file,omitempty"`
	CertFile           string `json:"cert_file,omitempty" yaml:"cert_file,omitempty"`
	KeyFile            string `json:"key_file,omitempty" yaml:"key_file,omitempty"`
	ServerName         string `json:"server_name,omitempty" yaml:"server_name,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty" yaml:"insecure_skip_verify,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("30s") in a spec.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

const defaultRequestTimeout = 30 * time.Second

func (c Config) requestTimeout() time.Duration {
	if c.RequestTimeout > 0 {
		return time.Duration(c.RequestTimeout)
	}
	return defaultRequestTimeout
}

func configErr(path, format string, args ...any) error {
	return &Error{Op: "config", Kind: ErrConfig, Err: fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))}
}

// Validate checks c without touching the network or the environment. Errors name the field
// path (relative to the connector's block in the spec).
func (c Config) Validate() error {
	if len(c.Brokers) == 0 {
		return configErr("brokers", "at least one broker (host:port) is required")
	}
	for i, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return configErr(fmt.Sprintf("brokers[%d]", i), "%q is not host:port", b)
		}
	}
	if c.RequestTimeout < 0 {
		return configErr("request_timeout", "must not be negative")
	}
	if s := c.SASL; s != nil {
		switch strings.ToUpper(s.Mechanism) {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		default:
			return configErr("sasl.mechanism", "%q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", s.Mechanism)
		}
		if s.Password != "" {
			return configErr("sasl.password", "a password never goes in the spec: put it in an environment variable and name it in sasl.password_env")
		}
		if s.PasswordEnv == "" {
			return configErr("sasl.password_env", "required: the environment variable that holds the password")
		}
		if (s.Username == "") == (s.UsernameEnv == "") {
			return configErr("sasl.username", "exactly one of username and username_env is required")
		}
	}
	if t := c.TLS; t != nil && !t.Enabled && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "") {
		return configErr("tls.enabled", "files are given but TLS is not enabled")
	}
	if t := c.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		return configErr("tls.cert_file", "cert_file and key_file go together")
	}
	return nil
}

func (c Config) lookupEnv(name string) (string, bool) {
	if c.env != nil {
		return c.env(name)
	}
	return os.LookupEnv(name)
}

// clientOpts turns c into franz-go options, reading secrets from the environment.
func (c Config) clientOpts() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rt := c.requestTimeout()
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.RetryTimeout(rt),
		kgo.RequestTimeoutOverhead(rt / 3),
		kgo.DialTimeout(min(rt, 10*time.Second)),
		// No KIP-714 telemetry push to the brokers: the pipeline exports its own metrics,
		// and a client closing with its network gone would wait a second for the push.
		kgo.DisableClientMetrics(),
		kgo.WithHooks(&reachedHook{key: clusterKey(c.Brokers)}),
	}
	if l := c.clientLogger(); l != nil {
		opts = append(opts, kgo.WithLogger(l))
	}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	} else {
		opts = append(opts, kgo.ClientID("clink-wasm"))
	}
	if s := c.SASL; s != nil {
		user := s.Username
		if s.UsernameEnv != "" {
			v, ok := c.lookupEnv(s.UsernameEnv)
			if !ok || v == "" {
				return nil, configErr("sasl.username_env", "environment variable %s is not set", s.UsernameEnv)
			}
			user = v
		}
		pass, ok := c.lookupEnv(s.PasswordEnv)
		if !ok || pass == "" {
			return nil, configErr("sasl.password_env", "environment variable %s is not set", s.PasswordEnv)
		}
		switch strings.ToUpper(s.Mechanism) {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
		}
	}
	var tc *tls.Config
	if t := c.TLS; t != nil && t.Enabled {
		var err error
		if tc, err = t.config(); err != nil {
			return nil, err
		}
	}
	switch {
	case c.dial != nil && tc != nil:
		dial := c.dial
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			conn, err := dial(ctx, network, host)
			if err != nil {
				return nil, err
			}
			cfg := tc.Clone()
			if cfg.ServerName == "" {
				cfg.ServerName, _, _ = net.SplitHostPort(host)
			}
			tconn := tls.Client(conn, cfg)
			if err := tconn.HandshakeContext(ctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tconn, nil
		}))
	case c.dial != nil:
		opts = append(opts, kgo.Dialer(c.dial))
	case tc != nil:
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}

func (t *TLSConfig) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, configErr("tls.ca_file", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, configErr("tls.ca_file", "%s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, configErr("tls.cert_file", "%v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// namedLogger adds the client's name to every line of a shared logger.
type namedLogger struct {
	kgo.Logger
	name string
}

func (l namedLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l.Logger.Log(level, msg, append(keyvals[:len(keyvals):len(keyvals)], "client", l.name)...)
}

// logEnv names the environment variable that turns franz-go's own log on, to stderr, at one
// of the levels error, warn, info or debug: what a user needs to see why a broker does not
// answer (CLINK_KAFKA_LOG=debug is verbose, and slows the clients).
const logEnv = "CLINK_KAFKA_LOG"

// clientLogger is the logger for c's clients: the one a test set, else franz-go's basic logger
// on stderr when logEnv asks for one, else none.
func (c Config) clientLogger() kgo.Logger {
	if c.logger != nil {
		return c.logger
	}
	v, _ := c.lookupEnv(logEnv)
	var level kgo.LogLevel
	switch strings.ToLower(v) {
	case "error":
		level = kgo.LogLevelError
	case "warn":
		level = kgo.LogLevelWarn
	case "info":
		level = kgo.LogLevelInfo
	case "debug":
		level = kgo.LogLevelDebug
	default:
		return nil
	}
	return kgo.BasicLogger(os.Stderr, level, func() string { return time.Now().UTC().Format("15:04:05.000000 ") })
}

// named returns c with its logger (if any) naming the client.
func (c Config) named(name string) Config {
	if l := c.clientLogger(); l != nil {
		c.logger = l
		if nl, ok := c.logger.(namedLogger); ok {
			c.logger = nl.Logger
		}
		c.logger = namedLogger{c.logger, name}
	}
	return c
}

// newClient builds a franz-go client from c plus extra options.
func (c Config) newClient(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := c.clientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, &Error{Op: "connect", Kind: ErrConfig, Err: err}
	}
	return cl, nil
}
