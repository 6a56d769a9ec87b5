//! A hub on loopback serving one repo's files the way hf-hub 0.5's client reads them:
//!
//! - `GET /{owner}/{repo}/resolve/{revision}/{file}` with `Range: bytes=0-0`, redirects
//!   not followed: the metadata. A file in LFS answers `302` to its store URL with
//!   `X-Repo-Commit`, `X-Linked-Etag` (quoted SHA-256) and `X-Linked-Size`; the client
//!   then asks the store for `bytes=0-0` and reads the size from `Content-Range`. A file in
//!   git answers `206` directly, its `ETag` the git blob SHA-1.
//! - The same URL with `Range: bytes=N-`, redirects followed: the download, resumed from
//!   byte N of the part file.
//! - An unknown file is `404` (`X-Error-Code: EntryNotFound`), an unknown repo `401`
//!   (`RepoNotFound`), as the hub answers without a token.
//!
//! - [`Fault::RedirectLoop`] answers every request with a redirect to itself.
//!
//! Each connection gets one answer and is closed. The hub stops when dropped, or a minute
//! after it started, whichever is first, and binds 127.0.0.1 only.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the hub misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The next download closes the connection once byte `at` is sent; later ones are
    /// whole.
    CutOnce {
        at: usize,
    },
    /// Every connection is accepted and never answered.
    Hang,
    /// Downloads send up to byte `n` of the file, then nothing more.
    StallAt(usize),
    /// Downloads send the file with one byte changed, under the true file's name.
    Corrupt,
    /// Every request is redirected to the path it asked for, by a `Location` that is
    /// relative (`/path`) or absolute (`http://host/path`), carrying the hub's headers.
    RedirectLoop {
        relative: bool,
    },
}

/// One request as the hub saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub range: Option<String>,
}

struct File {
    name: String,
    bytes: Vec<u8>,
    lfs: bool,
}

struct State {
    repo: String,
    files: Vec<File>,
    fault: Mutex<Fault>,
    log: Mutex<Vec<Request>>,
    stop: AtomicBool,
    deadline: Instant,
    addr: SocketAddr,
}

pub struct FakeHub {
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

const LIFETIME: Duration = Duration::from_secs(60);
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl FakeHub {
    /// Serves `files` (name in the repo, bytes, whether in LFS) of `repo`.
    pub fn start(repo: &str, files: Vec<(&str, Vec<u8>, bool)>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let state = Arc::new(State {
            repo: repo.to_string(),
            files: files
                .into_iter()
                .map(|(name, bytes, lfs)| File {
                    name: name.to_string(),
                    bytes,
                    lfs,
                })
                .collect(),
            fault: Mutex::new(Fault::None),
            log: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            deadline: Instant::now() + LIFETIME,
            addr: listener.local_addr().unwrap(),
        });
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            let mut handlers: Vec<JoinHandle<()>> = Vec::new();
            while !st.stopped() {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let st = st.clone();
                        handlers.push(std::thread::spawn(move || st.serve(stream)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for h in handlers {
                let _ = h.join();
            }
        });
        FakeHub {
            state,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.state.addr)
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.state.fault.lock().unwrap() = fault;
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.log.lock().unwrap().clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn sha256(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

impl State {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() > self.deadline
    }

    /// Keeps a connection open, silent, until the hub stops.
    fn hold(&self, stream: TcpStream) {
        while !self.stopped() {
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(stream);
    }

    fn serve(&self, mut stream: TcpStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.set_nonblocking(false);
        if *self.fault.lock().unwrap() == Fault::Hang {
            return self.hold(stream);
        }
        // A bare connect (the client's reachability probe) sends nothing.
        let Some(head) = read_head(&mut stream) else {
            return;
        };
        let mut lines = head.lines();
        let path = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("")
            .to_string();
        let range = lines.find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("range")
                .then(|| v.trim().to_string())
        });
        self.log.lock().unwrap().push(Request {
            path: path.clone(),
            range: range.clone(),
        });
        let resp = match *self.fault.lock().unwrap() {
            Fault::RedirectLoop { relative } => Response::Redirect {
                location: if relative {
                    path.clone()
                } else {
                    format!("http://{}{path}", self.addr)
                },
                etag: "ab".repeat(32),
                size: 1,
            },
            _ => self.route(&path),
        };
        self.answer(stream, resp, range.as_deref());
    }

    fn route(&self, path: &str) -> Response<'_> {
        if let Some(sha) = path.strip_prefix("/lfs/") {
            return match self.files.iter().find(|f| f.lfs && sha256(&f.bytes) == sha) {
                Some(f) => Response::Body {
                    bytes: &f.bytes,
                    etag: sha256(&f.bytes),
                },
                None => Response::Status(404, "EntryNotFound"),
            };
        }
        let prefix = format!("/{}/resolve/", self.repo);
        let Some(rest) = path.strip_prefix(&prefix) else {
            return Response::Status(401, "RepoNotFound");
        };
        let Some((_revision, file)) = rest.split_once('/') else {
            return Response::Status(404, "RevisionNotFound");
        };
        match self.files.iter().find(|f| f.name == file) {
            None => Response::Status(404, "EntryNotFound"),
            Some(f) if f.lfs => Response::Redirect {
                location: format!("http://{}/lfs/{}", self.addr, sha256(&f.bytes)),
                etag: sha256(&f.bytes),
                size: f.bytes.len(),
            },
            Some(f) => Response::Body {
                bytes: &f.bytes,
                etag: baton::fetch::hub::git_blob_sha1(&f.bytes),
            },
        }
    }

    fn answer(&self, mut stream: TcpStream, resp: Response<'_>, range: Option<&str>) {
        let common = format!("X-Repo-Commit: {COMMIT}\r\nConnection: close\r\n");
        match resp {
            Response::Status(code, why) => {
                let head = format!(
                    "HTTP/1.1 {code} {}\r\nX-Error-Code: {why}\r\nContent-Length: {}\r\n{common}\r\n",
                    if code == 404 { "Not Found" } else { "Unauthorized" },
                    why.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(why.as_bytes());
            }
            Response::Redirect {
                location,
                etag,
                size,
            } => {
                let head = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {location}\r\nETag: \"{}\"\r\n\
                     X-Linked-Etag: \"{etag}\"\r\nX-Linked-Size: {size}\r\n\
                     Content-Length: 0\r\n{common}\r\n",
                    &etag[..40]
                );
                let _ = stream.write_all(head.as_bytes());
            }
            Response::Body { bytes, etag } => {
                self.send_body(&mut stream, bytes, &etag, range, &common);
            }
        }
        let _ = stream.flush();
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }

    fn send_body(
        &self,
        stream: &mut TcpStream,
        bytes: &[u8],
        etag: &str,
        range: Option<&str>,
        common: &str,
    ) {
        let len = bytes.len();
        let (start, end) = match range.and_then(parse_range) {
            Some((s, _)) if s >= len => {
                let head = format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\n\
                     Content-Length: 0\r\n{common}\r\n"
                );
                let _ = stream.write_all(head.as_bytes());
                return;
            }
            Some((s, e)) => (s, e.unwrap_or(len - 1).min(len - 1)),
            None => (0, len - 1),
        };
        let status = if range.is_some() {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nETag: \"{etag}\"\r\nContent-Range: bytes {start}-{end}/{len}\r\n\
             Content-Length: {}\r\nAccept-Ranges: bytes\r\n{common}\r\n",
            end + 1 - start
        );
        let _ = stream.write_all(head.as_bytes());
        let mut body = bytes[start..=end].to_vec();
        // The metadata probe (one byte) is always answered truly; faults hit downloads.
        let download = end > start;
        let fault = *self.fault.lock().unwrap();
        match fault {
            Fault::CutOnce { at } if download && at > start => {
                *self.fault.lock().unwrap() = Fault::None;
                let _ = stream.write_all(&body[..(at - start).min(body.len())]);
            }
            Fault::StallAt(n) if download && n > start => {
                let _ = stream.write_all(&body[..(n - start).min(body.len())]);
                let _ = stream.flush();
                while !self.stopped() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Fault::Corrupt if download => {
                let mid = body.len() / 2;
                body[mid] ^= 0x5a;
                let _ = stream.write_all(&body);
            }
            _ => {
                let _ = stream.write_all(&body);
            }
        }
    }
}

enum Response<'a> {
    Status(u16, &'static str),
    Redirect {
        location: String,
        etag: String,
        size: usize,
    },
    Body {
        bytes: &'a [u8],
        etag: String,
    },
}

/// `bytes=S-` or `bytes=S-E`.
fn parse_range(v: &str) -> Option<(usize, Option<usize>)> {
    let (s, e) = v.strip_prefix("bytes=")?.split_once('-')?;
    let s = s.trim().parse().ok()?;
    let e = if e.trim().is_empty() {
        None
    } else {
        Some(e.trim().parse().ok()?)
    };
    Some((s, e))
}

/// The request head, up to the blank line; `None` when the peer sends nothing.
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&byte[..n]),
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}
