//! A remote command server in SPDY/3.1 and `v4.channel.k8s.io`, just
//! capable enough to stand for a container runtime's streaming server
//! behind the kubelet: it takes the client's streams (their header blocks
//! decompressed with flate2, one zlib stream for the connection), writes a
//! greeting on stdout, echoes stdin to stdout until stdin's FIN, pings the
//! client once, then reports the exit status on the error stream, FINs its
//! streams and sends GOAWAY. Written from the SPDY/3 draft, apart from the
//! server's own codec, so the two check each other.
use std::sync::{Arc, Mutex};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// What the client did, for the test to check.
#[derive(Debug, Default, Clone)]
pub struct Transcript {
    /// Each SYN_STREAM's `streamtype`, in order.
    pub streams: Vec<String>,
    /// Every header name seen, lowercase as on the wire.
    pub header_names: Vec<String>,
    pub stdin: Vec<u8>,
    pub stdin_fin: bool,
    pub resize: Vec<u8>,
    /// The client answered our PING.
    pub pong: bool,
}

/// What the "command" does.
#[derive(Debug, Clone)]
pub struct Script {
    pub greeting: String,
    pub exit: u8,
    pub transcript: Arc<Mutex<Transcript>>,
}

/// The streams a kubelet-side query asks for (`input=1&output=1&...`), as
/// the streaming server counts them: tty drops stderr, adds resize.
pub fn expected_streams(uri: &str) -> usize {
    let query = uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let on = |k: &str| query.split('&').any(|kv| kv == format!("{k}=1"));
    1 + usize::from(on("input"))
        + usize::from(on("output"))
        + usize::from(on("error") && !on("tty"))
        + usize::from(on("tty"))
}

struct Conn<IO> {
    io: IO,
    inflate: Decompress,
    deflate: Compress,
}

enum Frame {
    Control {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Conn<IO> {
    async fn read(&mut self) -> Option<Frame> {
        let mut head = [0u8; 8];
        self.io.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut payload = vec![0u8; len];
        self.io.read_exact(&mut payload).await.ok()?;
        let first = u32_at(&head, 0);
        Some(if first & 0x8000_0000 != 0 {
            assert_eq!((first >> 16) & 0x7fff, 3, "SPDY version");
            Frame::Control {
                kind: (first & 0xffff) as u16,
                flags: head[4],
                payload,
            }
        } else {
            Frame::Data {
                stream: first,
                fin: head[4] & 1 != 0,
                data: payload,
            }
        })
    }

    /// One block of the connection's zlib stream, as (name, value) pairs.
    fn headers(&mut self, block: &[u8]) -> Vec<(String, String)> {
        let mut raw = Vec::with_capacity(4096);
        let before = self.inflate.total_in();
        self.inflate
            .decompress_vec(block, &mut raw, FlushDecompress::Sync)
            .expect("a zlib header block");
        assert_eq!(
            (self.inflate.total_in() - before) as usize,
            block.len(),
            "the whole block decodes from this frame"
        );
        let mut at = 4;
        let mut take = || {
            let len = u32_at(&raw, at) as usize;
            let s = String::from_utf8(raw[at + 4..at + 4 + len].to_vec()).unwrap();
            at += 4 + len;
            s
        };
        let n = u32_at(&raw, 0);
        (0..n).map(|_| (take(), take())).collect()
    }

    async fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) {
        let mut f = vec![0x80, 3];
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        self.io.write_all(&f).await.unwrap();
    }

    async fn reply(&mut self, stream: u32) {
        // An empty header block, compressed and sync-flushed.
        let mut block = Vec::with_capacity(64);
        self.deflate
            .compress_vec(&[0, 0, 0, 0], &mut block, FlushCompress::Sync)
            .unwrap();
        let mut payload = stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&block);
        self.control(2, 0, &payload).await;
    }

    async fn data(&mut self, stream: u32, data: &[u8], fin: bool) {
        let mut f = stream.to_be_bytes().to_vec();
        f.extend_from_slice(&((u32::from(fin) << 24) | data.len() as u32).to_be_bytes());
        f.extend_from_slice(data);
        self.io.write_all(&f).await.unwrap();
    }
}

/// The v4 error stream's Status for an exit code.
fn status(exit: u8) -> String {
    if exit == 0 {
        return r#"{"metadata":{},"status":"Success"}"#.into();
    }
    serde_json::json!({
        "metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [sh], exit code {exit}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit.to_string()}]},
    })
    .to_string()
}

pub async fn serve<IO: AsyncRead + AsyncWrite + Unpin>(io: IO, expected: usize, script: Script) {
    let mut c = Conn {
        io,
        inflate: Decompress::new(true),
        deflate: Compress::new(Compression::default(), true),
    };
    let log = script.transcript.clone();
    let mut ids: Vec<(String, u32)> = Vec::new();
    let id =
        |ids: &[(String, u32)], kind: &str| ids.iter().find(|(k, _)| k == kind).map(|(_, id)| *id);
    // The streams, each answered at once, as spdystream does.
    while ids.len() < expected {
        let Some(Frame::Control {
            kind: 1, payload, ..
        }) = c.read().await
        else {
            panic!("expected SYN_STREAM {} of {expected}", ids.len() + 1);
        };
        let stream = u32_at(&payload, 0) & 0x7fff_ffff;
        let headers = c.headers(&payload[10..]);
        let kind = headers
            .iter()
            .find(|(n, _)| n == "streamtype")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        {
            let mut log = log.lock().unwrap();
            log.streams.push(kind.clone());
            log.header_names
                .extend(headers.iter().map(|(n, _)| n.clone()));
        }
        ids.push((kind, stream));
        c.reply(stream).await;
    }
    let (stdin, stdout, resize) = (id(&ids, "stdin"), id(&ids, "stdout"), id(&ids, "resize"));
    c.control(6, 0, &2u32.to_be_bytes()).await;
    if let Some(out) = stdout {
        c.data(out, script.greeting.as_bytes(), false).await;
    }
    let mut pong = false;
    let mut stdin_done = stdin.is_none();
    while !(pong && stdin_done) {
        match c.read().await {
            None => return,
            Some(Frame::Control {
                kind: 6, payload, ..
            }) => {
                assert_eq!(u32_at(&payload, 0), 2, "our ping's id");
                pong = true;
            }
            Some(Frame::Control { kind, flags, .. }) => {
                panic!("unexpected control frame {kind} (flags {flags})")
            }
            Some(Frame::Data { stream, fin, data }) => {
                if Some(stream) == stdin {
                    log.lock().unwrap().stdin.extend_from_slice(&data);
                    if let Some(out) = stdout
                        && !data.is_empty()
                    {
                        c.data(out, &data, false).await;
                    }
                    if fin {
                        log.lock().unwrap().stdin_fin = true;
                        stdin_done = true;
                    }
                } else if Some(stream) == resize {
                    log.lock().unwrap().resize.extend_from_slice(&data);
                } else {
                    panic!("data on stream {stream}, which the client does not write");
                }
            }
        }
    }
    log.lock().unwrap().pong = true;
    let error = id(&ids, "error").expect("an error stream");
    c.data(error, status(script.exit).as_bytes(), true).await;
    for (kind, stream) in &ids {
        if kind == "stdout" || kind == "stderr" {
            c.data(*stream, &[], true).await;
        }
    }
    // GOAWAY, last good stream 0, status OK; then the connection closes.
    c.control(7, 0, &[0; 8]).await;
    let _ = c.io.shutdown().await;
}
