//! The client's address for per-address limits. The socket's peer is the client unless it is a
//! trusted proxy (`ENGRAM_TRUSTED_PROXIES`, CIDRs); only then is `X-Forwarded-For` read, from the
//! right: each proxy appends the address it received from, so the rightmost hop that is not a
//! trusted proxy is the client, and whatever a client writes into the header itself (to the
//! left) is never believed.
use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;

/// One network, `10.0.0.0/8` or `::1/128` (a bare address is a /32 or /128).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or CIDR"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { network, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4 address seen through an IPv6 socket (`::ffff:10.0.0.1`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The proxies whose `X-Forwarded-For` is believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// A comma-separated list of CIDRs; empty trusts no one.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Cidr::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client of a request that arrived from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return peer;
        }
        // Every X-Forwarded-For line, in order, is one list.
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            // A hop that is not an address ends the chain: what stands left of it is the
            // client's own writing.
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = canonical(ip);
            if !self.trusts(client) {
                return client;
            }
        }
        client
    }
}

/// `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    hop.parse::<SocketAddr>().ok().map(|s| s.ip())
}

/// The client address as the per-address limits key it.
pub fn client_key(
    trusted: &TrustedProxies,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
) -> String {
    match peer {
        Some(peer) => trusted.client(peer.ip(), headers).to_string(),
        None => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_match_their_networks_only() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(ip("10.200.1.2")) && !c.contains(ip("11.0.0.1")));
        assert!(c.contains(ip("::ffff:10.0.0.1")), "IPv4 seen through IPv6");
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        for bad in ["10.0.0.0/33", "banana", "10.0.0/8", "::/129"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert!(TrustedProxies::parse("10.0.0.0/8, ,::1").is_ok());
        assert!(TrustedProxies::parse("10.0.0.0/8,nope").is_err());
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_peer_and_from_the_right() {
        let none = TrustedProxies::default();
        let proxy = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let h = headers(&["203.0.113.7"]);
        // Not trusted: the header is ignored.
        assert_eq!(none.client(ip("10.0.0.2"), &h), ip("10.0.0.2"));
        assert_eq!(proxy.client(ip("198.51.100.9"), &h), ip("198.51.100.9"));
        // Through the proxy: the address it saw.
        assert_eq!(proxy.client(ip("10.0.0.2"), &h), ip("203.0.113.7"));
        // A client writing its own header: only the hop the proxy appended counts.
        let spoofed = headers(&["1.1.1.1, 2.2.2.2", "203.0.113.7"]);
        assert_eq!(proxy.client(ip("10.0.0.2"), &spoofed), ip("203.0.113.7"));
        // Two trusted proxies in a row, ports and IPv6 hops.
        let chain = headers(&["9.9.9.9, 203.0.113.7:5555, 10.1.1.1"]);
        assert_eq!(proxy.client(ip("10.0.0.2"), &chain), ip("203.0.113.7"));
        let v6 = headers(&["[2001:db8::5]:443"]);
        assert_eq!(proxy.client(ip("10.0.0.2"), &v6), ip("2001:db8::5"));
        // No header, or garbage where the client's hop should be: the proxy itself.
        assert_eq!(proxy.client(ip("10.0.0.2"), &headers(&[])), ip("10.0.0.2"));
        assert_eq!(
            proxy.client(ip("10.0.0.2"), &headers(&["unknown"])),
            ip("10.0.0.2")
        );
        // Every hop trusted: the leftmost.
        assert_eq!(
            proxy.client(ip("10.0.0.2"), &headers(&["10.9.9.9, 10.1.1.1"])),
            ip("10.9.9.9")
        );
    }
}
