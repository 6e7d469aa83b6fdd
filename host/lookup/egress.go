package lookup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// Metadata services of the major clouds. They are refused unless an endpoint sets
// egress.allow_metadata, because a lookup that reaches one can steal the host's credentials.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OCI, DigitalOcean, OpenStack
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("169.254.170.23"),  // AWS EKS pod identity
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6
	netip.MustParseAddr("fd00:ec2::23"),    // AWS EKS pod identity over IPv6
	netip.MustParseAddr("fd20:ce::254"),    // GCP metadata over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud (classic)
}

var metadataHosts = []string{
	"metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.internal",
	"instance-data", "instance-data.ec2.internal", "metadata.tencentyun.com", "metadata.packet.net",
}

func isMetadataHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, m := range metadataHosts {
		if h == m {
			return true
		}
	}
	return false
}

var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour  = netip.MustParsePrefix("2002::/16")
	broadcast  = netip.MustParseAddr("255.255.255.255")
)

// egressPolicy is the compiled form of EgressPolicy.
type egressPolicy struct {
	EgressPolicy
	allowed, denied []netip.Prefix
}

func (p EgressPolicy) compile() (*egressPolicy, error) {
	c := &egressPolicy{EgressPolicy: p}
	for _, s := range p.AllowedCIDRs {
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("egress.allowed_cidrs: %w", err)
		}
		c.allowed = append(c.allowed, pf.Masked())
	}
	for _, s := range p.DeniedCIDRs {
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("egress.denied_cidrs: %w", err)
		}
		c.denied = append(c.denied, pf.Masked())
	}
	return c, nil
}

// embedded returns the IPv4 address an IPv6 address carries (mapped, NAT64, 6to4), so that
// policy applies to where the packet really goes.
func embedded(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		b := ip.As16()
		switch {
		case nat64.Contains(ip):
			return netip.AddrFrom4([4]byte(b[12:16]))
		case sixToFour.Contains(ip):
			return netip.AddrFrom4([4]byte(b[2:6]))
		}
	}
	return ip
}

// check returns a KindRefused error if the policy forbids connecting to ip.
func (p *egressPolicy) check(ip netip.Addr) error {
	ip = ip.WithZone("")
	for _, a := range []netip.Addr{ip.Unmap(), embedded(ip)} {
		if err := p.checkOne(a); err != nil {
			return err
		}
	}
	return nil
}

func (p *egressPolicy) checkOne(ip netip.Addr) error {
	deny := func(why string) error {
		return &Error{Kind: KindRefused, Rule: RuleEgress, Reason: "forbidden address " + ip.String() + " (" + why + ")", notSent: true}
	}
	switch {
	case !ip.IsValid() || ip.IsUnspecified():
		return deny("unspecified")
	case ip.IsMulticast() || ip == broadcast:
		return deny("multicast or broadcast")
	case ip.IsLoopback() && !p.AllowLoopback:
		return deny("loopback; egress.allow_loopback")
	}
	for _, m := range metadataAddrs {
		if ip == m {
			if !p.AllowMetadata {
				return deny("cloud metadata; egress.allow_metadata")
			}
			return nil // an explicit metadata allowance implies its link-local address
		}
	}
	if (linkLocal4.Contains(ip) || linkLocal6.Contains(ip)) && !p.AllowLinkLocal {
		return deny("link-local; egress.allow_link_local")
	}
	for _, d := range p.denied {
		if d.Contains(ip) {
			return deny("egress.denied_cidrs")
		}
	}
	if len(p.allowed) > 0 {
		for _, a := range p.allowed {
			if a.Contains(ip) {
				return nil
			}
		}
		return deny("not in egress.allowed_cidrs")
	}
	return nil
}

// DialFunc dials a network address; net.Dialer.DialContext is one. The endpoint calls it only
// with a literal IP address that its egress policy has already admitted.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// ResolveFunc resolves a host name to addresses; (*net.Resolver).LookupNetIP with network "ip"
// is the default.
type ResolveFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// guardedDialer resolves, checks every address against the policy, and dials only admitted
// literal addresses: the address checked is the address dialled, so a DNS answer that changes
// between check and connect (rebinding) changes nothing.
type guardedDialer struct {
	policy  *egressPolicy
	resolve ResolveFunc
	dial    DialFunc
}

func (g *guardedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, &Error{Kind: KindRefused, Rule: RuleEgress, Reason: "bad address", Err: err, notSent: true}
	}
	if !g.policy.AllowMetadata && isMetadataHost(host) {
		return nil, &Error{Kind: KindRefused, Rule: RuleEgress, Reason: "metadata host " + host, notSent: true}
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		ips, err = g.resolve(ctx, host)
		if err != nil {
			return nil, &Error{Kind: KindUnavailable, Reason: "resolve " + host, Err: err, notSent: true}
		}
	}
	var firstErr error
	for _, ip := range ips {
		if err := g.policy.check(ip); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		c, err := g.dial(ctx, network, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil || Kind(firstErr) == KindRefused {
			firstErr = &Error{Kind: KindUnavailable, Reason: "dial", Err: err, notSent: true}
		}
	}
	if firstErr == nil {
		firstErr = &Error{Kind: KindUnavailable, Reason: "no address for " + host, notSent: true}
	}
	return nil, firstErr
}

// controlCheck is installed as net.Dialer.Control on the default dialer: a second check on
// the socket's actual destination, in case a custom DialFunc ever resolves names itself.
func (p *egressPolicy) controlCheck(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errors.New("lookup: unparseable dial address " + address)
	}
	return p.check(ap.Addr())
}
