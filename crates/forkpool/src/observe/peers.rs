//! The clients a process is talking to, as the kernel lists them: its
//! socket descriptors (`/proc/PID/fd`) matched by inode against the
//! established TCP connections of `/proc/net/tcp` and `/proc/net/tcp6`.
//!
//! In `kernel` dispatch the supervisor never holds a child's connection,
//! so it cannot remember the client's address as it does when it hands a
//! connection over; `forkpool status` asks here instead, only when it is
//! asked and only for busy children.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `st` of an established connection in `/proc/net/tcp`.
const ESTABLISHED: &str = "01";

/// The established TCP connections of the whole network namespace, by
/// socket inode: their remote address. Empty where `/proc` cannot be read.
pub fn established_by_inode() -> HashMap<u64, SocketAddr> {
    let mut all = HashMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            all.extend(text.lines().skip(1).filter_map(parse_established));
        }
    }
    all
}

/// The remote addresses of the established TCP connections `pid` holds,
/// looked up in `established` (from [`established_by_inode`]).
pub fn peers_of(pid: i32, established: &HashMap<u64, SocketAddr>) -> Vec<SocketAddr> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| socket_inode(&target.to_string_lossy()))
        .filter_map(|inode| established.get(&inode).copied())
        .collect()
}

/// `socket:[INODE]`, the target of a socket descriptor's link.
fn socket_inode(target: &str) -> Option<u64> {
    target
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// One line of `/proc/net/tcp{,6}`: `(inode, remote address)` if the
/// connection is established.
fn parse_established(line: &str) -> Option<(u64, SocketAddr)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if fields.len() < 10 || fields[3] != ESTABLISHED {
        return None;
    }
    let remote = parse_address(fields[2])?;
    let inode = fields[9].parse().ok()?;
    Some((inode, remote))
}

/// `HEXADDR:HEXPORT` as the kernel prints it: the address as 32-bit words
/// in host byte order (one for IPv4, four for IPv6), the port big-endian.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words = (0..addr.len() / 8)
        .map(|i| u32::from_str_radix(&addr[8 * i..8 * i + 8], 16).map(u32::to_ne_bytes))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    let ip = match words.as_slice() {
        [w] => IpAddr::V4(Ipv4Addr::from(*w)),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].into_iter().enumerate() {
                bytes[4 * i..4 * i + 4].copy_from_slice(w);
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lines_give_the_remote_address_of_established_connections() {
        // x86-64 (little-endian) lines: 127.0.0.1:8080 <- 127.0.0.1:51234.
        let v4 = "   3: 0100007F:1F90 0100007F:C822 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_established(v4),
            Some((123456, "127.0.0.1:51234".parse().unwrap()))
        );
        let listening = v4.replace(" 01 ", " 0A ");
        assert_eq!(parse_established(&listening), None);
        // ::1 as four host-order words, and a v4-mapped address.
        let v6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_established(v6),
            Some((777, "[::1]:54321".parse().unwrap()))
        );
        let mapped = "0000000000000000FFFF00000100007F:C822";
        assert_eq!(
            parse_address(mapped),
            Some("127.0.0.1:51234".parse().unwrap())
        );
        assert_eq!(parse_address("nonsense"), None);
        assert_eq!(socket_inode("socket:[42]"), Some(42));
        assert_eq!(socket_inode("pipe:[42]"), None);
    }

    #[test]
    fn a_process_holding_a_connection_shows_its_client() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let peers = peers_of(std::process::id() as i32, &established_by_inode());
        assert!(
            peers.contains(&client.local_addr().unwrap()),
            "{peers:?} lacks {:?}",
            client.local_addr()
        );
    }
}
