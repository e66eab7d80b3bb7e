//! A minimal HTTP/1.1 client for talking to a local `llama-server` (loopback only).
//!
//! One request per connection (`Connection: close`); responses are read to the end and
//! decoded according to `Transfer-Encoding: chunked` or `Content-Length`. The host is
//! always 127.0.0.1: callers pass only a port, so nothing here can reach another machine.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code, e.g. 200.
    pub status: u16,
    /// Header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The decoded body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "response body is not JSON: {}",
                String::from_utf8_lossy(&self.body[..self.body.len().min(300)])
            )
        })
    }

    /// Fails unless the status is 2xx, quoting the body.
    pub fn ensure_success(self, what: &str) -> Result<Response> {
        if !(200..300).contains(&self.status) {
            bail!(
                "{what}: HTTP {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(500)])
            );
        }
        Ok(self)
    }
}

/// `GET path` on 127.0.0.1:`port`.
pub fn get(port: u16, path: &str, timeout: Duration) -> Result<Response> {
    request(port, "GET", path, None, timeout)
}

/// `POST path` with a JSON body on 127.0.0.1:`port`.
pub fn post_json(
    port: u16,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<Response> {
    let bytes = serde_json::to_vec(body).context("cannot serialise request body")?;
    request(port, "POST", path, Some(&bytes), timeout)
}

/// One request: `body` is sent as `application/json` when given.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream
        .write_all(&request_bytes(port, method, path, body))
        .with_context(|| format!("cannot send {method} {path} to {addr}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the response to {method} {path} from {addr}"))?;
    parse_response(&raw).with_context(|| format!("bad response to {method} {path} from {addr}"))
}

/// The bytes of a request (head and body).
pub fn request_bytes(port: u16, method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(body) = body {
        head.push_str("Content-Type: application/json\r\n");
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// Parses a whole response read up to the closed connection.
pub fn parse_response(raw: &[u8]) -> Result<Response> {
    let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("no end of headers in {} bytes", raw.len());
    };
    let head = std::str::from_utf8(&raw[..head_end]).context("headers are not UTF-8")?;
    let rest = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        bail!("bad status line {status_line:?}");
    };
    if !version.starts_with("HTTP/1.") {
        bail!("bad status line {status_line:?}");
    }
    let status: u16 = code
        .parse()
        .with_context(|| format!("bad status code in {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            bail!("bad header line {line:?}");
        };
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    response.body = if chunked {
        decode_chunked(rest)?
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len
            .parse()
            .with_context(|| format!("bad Content-Length {len:?}"))?;
        if rest.len() < len {
            bail!("body has {} bytes, Content-Length says {len}", rest.len());
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

/// Decodes a chunked body (trailers are ignored).
pub fn decode_chunked(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") else {
            bail!("chunked body: missing chunk size line");
        };
        let line = std::str::from_utf8(&data[..line_end]).context("chunk size is not text")?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size + 2 || &data[size..size + 2] != b"\r\n" {
            bail!("chunked body: truncated chunk of {size} bytes");
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parses_content_length_and_ignores_extra_bytes() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": 1234}garbage";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json().unwrap()["a"], 1234);
    }

    #[test]
    fn decodes_chunked_bodies() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\n\r\n";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.body, b"Wikipedia in \r\n\r\nchunks.");
        assert!(r
            .ensure_success("x")
            .unwrap_err()
            .to_string()
            .contains("503"));
    }

    #[test]
    fn rejects_malformed_responses() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"SMTP 200\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(decode_chunked(b"zz\r\n").is_err());
        assert!(decode_chunked(b"5\r\nab\r\n").is_err());
    }

    #[test]
    fn round_trip_over_loopback() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            // Read until the whole declared body arrived.
            loop {
                let n = conn.read(&mut buf).unwrap();
                seen.extend_from_slice(&buf[..n]);
                if n == 0 || seen.ends_with(b"{\"x\":1}") {
                    break;
                }
            }
            conn.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n{\"y\":2}\r\n0\r\n\r\n",
            )
            .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let body = serde_json::json!({"x": 1});
        let r = post_json(port, "/completion", &body, Duration::from_secs(10)).unwrap();
        assert_eq!(r.json().unwrap()["y"], 2);
        let seen = server.join().unwrap();
        assert!(seen.starts_with("POST /completion HTTP/1.1\r\n"), "{seen}");
        assert!(seen.contains("Content-Length: 7\r\n"), "{seen}");
        assert!(seen.contains("Connection: close\r\n"), "{seen}");
    }
}
