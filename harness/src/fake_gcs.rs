//! A Google Cloud Storage API for tests: fake-gcs-server (the Go module
//! `github.com/fsouza/fake-gcs-server`, which `cargo xtask setup`
//! installs with `go install` into
//! `$HOME/.cache/sluice/fake-gcs-server-<version>`), in memory, on a free
//! loopback port, killed on drop.
//!
//! It serves GCS's JSON API (buckets, listing, downloads, uploads with
//! `uploadType`). It does not serve the XML API's object `PUT` nor its
//! multipart uploads (fsouza/fake-gcs-server#331, #852), which is what
//! the object_store crate's GCS client writes with: [`endpoint`] is the
//! server as it is, [`xml_endpoint`] a gateway of the harness's in front
//! of it that translates those writes into JSON API uploads (see
//! `docs/connectors/object_store.md`).
//!
//! [`endpoint`]: FakeGcsServer::endpoint
//! [`xml_endpoint`]: FakeGcsServer::xml_endpoint
//!
//! ```no_run
//! let gcs = sluice_harness::fake_gcs::FakeGcsServer::start()?;
//! gcs.create_bucket("lake")?;
//! // store: gs://lake, credentials: gcs.xml_env() (a key with gcs_base_url)
//! # anyhow::Ok(())
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

use crate::served::{self, Served};

/// The fake-gcs-server release `cargo xtask setup` installs.
pub const FAKE_GCS_VERSION: &str = "1.56.1";

/// Where `cargo xtask setup` installs the server:
/// `$HOME/.cache/sluice/fake-gcs-server-<FAKE_GCS_VERSION>`, outside the
/// clone.
///
/// # Errors
///
/// When `$HOME` is not set.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("$HOME is not set")?;
    Ok(PathBuf::from(home)
        .join(".cache/sluice")
        .join(format!("fake-gcs-server-{FAKE_GCS_VERSION}")))
}

/// The server's binary: `$SLUICE_FAKE_GCS_SERVER`, else the one in
/// [`cache_dir`].
///
/// # Errors
///
/// When neither exists (the message says how to install it).
pub fn binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("SLUICE_FAKE_GCS_SERVER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let bin = cache_dir()?.join("fake-gcs-server");
    if !bin.is_file() {
        bail!(
            "fake-gcs-server {FAKE_GCS_VERSION} is not installed: {} is missing. Run `cargo xtask \
             setup` (it runs `GOBIN={} go install \
             github.com/fsouza/fake-gcs-server@v{FAKE_GCS_VERSION}`), or set \
             $SLUICE_FAKE_GCS_SERVER to a fake-gcs-server binary",
            bin.display(),
            cache_dir()?.display()
        );
    }
    Ok(bin)
}

/// A running fake-gcs-server.
pub struct FakeGcsServer {
    served: Served,
    gateway: gateway::Gateway,
}

impl FakeGcsServer {
    /// Starts fake-gcs-server (memory backend, plain HTTP) on a free
    /// loopback port, and the XML API gateway in front of it, and waits
    /// until the server answers.
    ///
    /// # Errors
    ///
    /// The server is missing (run `cargo xtask setup`), or it does not
    /// answer within a minute (the error quotes its log).
    pub fn start() -> anyhow::Result<FakeGcsServer> {
        let bin = binary()?;
        let served = Served::start(
            "fake-gcs-server",
            "`cargo xtask setup` installs it",
            |port, _dir| {
                let host = format!("127.0.0.1:{port}");
                let mut command = Command::new(&bin);
                command
                    .args(["-scheme", "http", "-host", "127.0.0.1"])
                    .args(["-port", &port.to_string(), "-backend", "memory"])
                    .args(["-public-host", &host])
                    .args(["-external-url", &format!("http://{host}")])
                    .args(["-log-level", "warn"]);
                command
            },
            |port| {
                matches!(
                    served::request(port, "GET", "/_internal/healthcheck", &[], &[]),
                    Ok((200, _))
                )
            },
        )?;
        let gateway =
            gateway::Gateway::start(SocketAddr::from((Ipv4Addr::LOCALHOST, served.port())))?;
        Ok(FakeGcsServer { served, gateway })
    }

    /// `http://127.0.0.1:<port>`: a sink's `endpoint:` (GCS's base URL).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.served.port())
    }

    /// A service-account key as the object_store crate's own CI gives it
    /// to fake-gcs-server: `disable_oauth` (requests go unsigned, no token
    /// is fetched) and `gcs_base_url` (this server).
    pub fn service_account_key(&self) -> String {
        serde_json::json!({
            "gcs_base_url": self.endpoint(),
            "disable_oauth": true,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        })
        .to_string()
    }

    /// The environment that points object_store's GCS client here:
    /// `GOOGLE_SERVICE_ACCOUNT_KEY` = [`service_account_key`](Self::service_account_key).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![(
            "GOOGLE_SERVICE_ACCOUNT_KEY".into(),
            self.service_account_key(),
        )]
    }

    /// `http://127.0.0.1:<port>` of the harness's XML API gateway in front
    /// of the server (the `gateway` module): where a `gs://` sink can
    /// write.
    pub fn xml_endpoint(&self) -> String {
        format!("http://{}", self.gateway.addr())
    }

    /// Multipart uploads the gateway has completed: the proof that a
    /// write took the multipart path.
    pub fn multipart_uploads_completed(&self) -> u64 {
        self.gateway.completed()
    }

    /// [`env`](Self::env) with the gateway as `gcs_base_url`.
    pub fn xml_env(&self) -> Vec<(String, String)> {
        let key = serde_json::json!({
            "gcs_base_url": self.xml_endpoint(),
            "disable_oauth": true,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        });
        vec![("GOOGLE_SERVICE_ACCOUNT_KEY".into(), key.to_string())]
    }

    /// Creates a bucket.
    ///
    /// # Errors
    ///
    /// The request failed or was refused.
    pub fn create_bucket(&self, bucket: &str) -> anyhow::Result<()> {
        let body = serde_json::json!({ "name": bucket }).to_string();
        match self.request(
            "POST",
            "/storage/v1/b",
            Some("application/json"),
            body.as_bytes(),
        )? {
            (200, _) => Ok(()),
            (status, body) => bail!(
                "creating bucket {bucket}: {status} {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// One unauthenticated HTTP/1.0 request, returning the status and
    /// body (the server checks no credentials).
    ///
    /// # Errors
    ///
    /// The connection failed or the response is malformed.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let headers: Vec<(String, String)> = content_type
            .map(|t| ("Content-Type".to_owned(), t.to_owned()))
            .into_iter()
            .collect();
        served::request(self.served.port(), method, path, &headers, body)
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        self.served.log()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.served.pid()
    }

    /// Pauses the server (SIGSTOP): it keeps what it holds (in memory)
    /// and answers nothing until [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.served.pause()
    }

    /// Resumes a [`pause`](Self::pause)d server (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal could not be sent.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.served.resume()
    }
}

/// GCS's XML API, the part the object_store crate writes with, in front
/// of fake-gcs-server's JSON API: what the server lacks
/// (fsouza/fake-gcs-server#331, #852), translated, so that a `gs://`
/// sink can be tested end to end on it.
///
/// - `PUT /BUCKET/KEY` (a put) becomes a JSON API media upload, with
///   `x-goog-if-generation-match` as its `ifGenerationMatch` (which the
///   server honours: `0` is create-only, a taken name answers 412).
/// - `POST ?uploads`, `PUT ?partNumber&uploadId`, `POST ?uploadId` and
///   `DELETE ?uploadId` (a multipart upload) keep the parts here and
///   upload them, concatenated in the order the completion lists them,
///   as one media upload (a generation match applies to it as to a put).
/// - Anything else (reads, listings, deletes) goes to the server as it is.
///
/// The translation is the harness's, not Google's: what it proves is that
/// the sink's client speaks the XML API as this reads it and that the
/// objects land whole in a GCS server. It answers `ETag` and
/// `x-goog-generation` from the server's object resource.
mod gateway {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use anyhow::{Context, bail};

    /// A multipart upload in progress: its key and its parts by number.
    type Upload = (String, HashMap<u32, Vec<u8>>);

    /// Headers, as names and values in order.
    type Headers = Vec<(String, String)>;

    struct Shared {
        server: SocketAddr,
        uploads: Mutex<HashMap<String, Upload>>,
        next_id: AtomicU64,
        completed: AtomicU64,
        stop: AtomicBool,
    }

    /// The gateway's listener, stopped on drop.
    pub(super) struct Gateway {
        addr: SocketAddr,
        shared: Arc<Shared>,
    }

    impl Gateway {
        /// Listens on a free loopback port, forwarding to `server`.
        pub(super) fn start(server: SocketAddr) -> anyhow::Result<Gateway> {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .context("binding the XML API gateway")?;
            let addr = listener.local_addr()?;
            let shared = Arc::new(Shared {
                server,
                uploads: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                completed: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            });
            let accepting = Arc::clone(&shared);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if accepting.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = Arc::clone(&accepting);
                    std::thread::spawn(move || serve(&shared, stream));
                }
            });
            Ok(Gateway { addr, shared })
        }

        pub(super) fn addr(&self) -> SocketAddr {
            self.addr
        }

        pub(super) fn completed(&self) -> u64 {
            self.shared.completed.load(Ordering::SeqCst)
        }
    }

    impl Drop for Gateway {
        fn drop(&mut self) {
            self.shared.stop.store(true, Ordering::SeqCst);
            // Wake the accept loop so that it sees the flag.
            let _ = TcpStream::connect(self.addr);
        }
    }

    /// One request as read from a client.
    struct Request {
        method: String,
        path: String,
        query: Vec<(String, String)>,
        raw_target: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Request {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        fn param(&self, name: &str) -> Option<&str> {
            self.query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// A response to send back.
    struct Response {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        /// A HEAD's: the `Content-Length` to announce without a body.
        head_length: Option<String>,
    }

    impl Response {
        fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
            Response {
                status,
                headers: Vec::new(),
                body: body.into(),
                head_length: None,
            }
        }
    }

    /// Serves a keep-alive connection until the client closes it.
    fn serve(shared: &Shared, stream: TcpStream) {
        let Ok(writer) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(stream);
        let mut writer = writer;
        while let Ok(Some(request)) = read_request(&mut reader) {
            let response = handle(shared, &request)
                .unwrap_or_else(|e| Response::new(502, format!("gateway: {e:#}").into_bytes()));
            if write_response(&mut writer, &response).is_err() {
                return;
            }
        }
    }

    fn handle(shared: &Shared, request: &Request) -> anyhow::Result<Response> {
        let (bucket, key) = match request.path.trim_start_matches('/').split_once('/') {
            Some((bucket, key)) if !key.is_empty() => (bucket.to_owned(), decode(key)),
            _ => return forward(shared, request),
        };
        let m = request.method.as_str();
        if m == "POST" && request.param("uploads").is_some() {
            let id = format!("gateway-{}", shared.next_id.fetch_add(1, Ordering::SeqCst));
            lock(&shared.uploads).insert(id.clone(), (key.clone(), HashMap::new()));
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><InitiateMultipartUploadResult>\
                 <Bucket>{bucket}</Bucket><Key>{}</Key><UploadId>{id}</UploadId>\
                 </InitiateMultipartUploadResult>",
                escape(&key)
            );
            return Ok(Response::new(200, xml));
        }
        if let Some(id) = request.param("uploadId") {
            return multipart(shared, request, &bucket, &key, id);
        }
        if m == "PUT" {
            let generation = request.header("x-goog-if-generation-match");
            return upload(shared, &bucket, &key, &request.body, generation, false);
        }
        forward(shared, request)
    }

    fn multipart(
        shared: &Shared,
        request: &Request,
        bucket: &str,
        key: &str,
        id: &str,
    ) -> anyhow::Result<Response> {
        let mut uploads = lock(&shared.uploads);
        let Some((upload_key, parts)) = uploads.get_mut(id) else {
            return Ok(Response::new(404, "no such upload"));
        };
        if upload_key != key {
            return Ok(Response::new(400, "the upload is of another key"));
        }
        match request.method.as_str() {
            "PUT" => {
                let number: u32 = request
                    .param("partNumber")
                    .and_then(|n| n.parse().ok())
                    .context("a part without a partNumber")?;
                parts.insert(number, request.body.clone());
                let mut response = Response::new(200, Vec::new());
                response
                    .headers
                    .push(("ETag".into(), format!("\"{id}-{number}\"")));
                Ok(response)
            }
            "DELETE" => {
                uploads.remove(id);
                Ok(Response::new(204, Vec::new()))
            }
            "POST" => {
                let listed = String::from_utf8_lossy(&request.body).into_owned();
                let mut whole = Vec::new();
                for number in listed.split("<PartNumber>").skip(1) {
                    let number: u32 = number
                        .split('<')
                        .next()
                        .and_then(|n| n.trim().parse().ok())
                        .context("a bad PartNumber")?;
                    let part = parts
                        .get(&number)
                        .with_context(|| format!("part {number} was never uploaded"))?;
                    whole.extend_from_slice(part);
                }
                uploads.remove(id);
                drop(uploads);
                let generation = request.header("x-goog-if-generation-match");
                let response = upload(shared, bucket, key, &whole, generation, true)?;
                if response.status == 200 {
                    shared.completed.fetch_add(1, Ordering::SeqCst);
                }
                Ok(response)
            }
            other => Ok(Response::new(405, format!("{other} on an upload"))),
        }
    }

    /// A JSON API media upload of `body` as `key`; its answer as the XML
    /// API's (a completion's XML body when `completion`).
    fn upload(
        shared: &Shared,
        bucket: &str,
        key: &str,
        body: &[u8],
        generation: Option<&str>,
        completion: bool,
    ) -> anyhow::Result<Response> {
        let mut target = format!(
            "/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
            encode(key)
        );
        if let Some(generation) = generation {
            target.push_str(&format!("&ifGenerationMatch={}", encode(generation)));
        }
        let headers = [(
            "Content-Type".to_owned(),
            "application/octet-stream".to_owned(),
        )];
        let (status, _, answer) = send(shared.server, "POST", &target, &headers, body)?;
        if status != 200 {
            return Ok(Response::new(status, answer));
        }
        let object: serde_json::Value =
            serde_json::from_slice(&answer).context("the server's object resource")?;
        let etag = object["etag"].as_str().unwrap_or_default().to_owned();
        let generation = object["generation"].as_str().unwrap_or_default().to_owned();
        let mut response = if completion {
            Response::new(
                200,
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><CompleteMultipartUploadResult>\
                     <Bucket>{bucket}</Bucket><Key>{}</Key><ETag>\"{etag}\"</ETag>\
                     </CompleteMultipartUploadResult>",
                    escape(key)
                ),
            )
        } else {
            Response::new(200, Vec::new())
        };
        response
            .headers
            .push(("ETag".into(), format!("\"{etag}\"")));
        response
            .headers
            .push(("x-goog-generation".into(), generation));
        Ok(response)
    }

    /// The request as it came, to the server.
    fn forward(shared: &Shared, request: &Request) -> anyhow::Result<Response> {
        let headers: Vec<(String, String)> = request
            .headers
            .iter()
            .filter(|(k, _)| {
                !["host", "connection", "content-length", "transfer-encoding"]
                    .contains(&k.to_ascii_lowercase().as_str())
            })
            .cloned()
            .collect();
        let (status, answer_headers, body) = send(
            shared.server,
            &request.method,
            &request.raw_target,
            &headers,
            &request.body,
        )?;
        let mut response = Response::new(status, body);
        for (name, value) in answer_headers {
            match name.to_ascii_lowercase().as_str() {
                "connection" | "transfer-encoding" => {}
                "content-length" => {
                    if request.method == "HEAD" {
                        response.head_length = Some(value);
                    }
                }
                _ => response.headers.push((name, value)),
            }
        }
        Ok(response)
    }

    /// One HTTP/1.0 request to the server (which then answers without
    /// chunks and closes): its status, headers and body.
    fn send(
        server: SocketAddr,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> anyhow::Result<(u16, Headers, Vec<u8>)> {
        let mut stream = TcpStream::connect(server).context("connecting to fake-gcs-server")?;
        let mut head = format!(
            "{method} {target} HTTP/1.0\r\nHost: {server}\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("no status line in {status_line:?}"))?;
        let headers = read_headers(&mut reader)?;
        let mut out = Vec::new();
        if method != "HEAD" {
            reader.read_to_end(&mut out)?;
        }
        Ok((status, headers, out))
    }

    fn read_headers(reader: &mut impl BufRead) -> anyhow::Result<Headers> {
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                bail!("the connection closed in the headers");
            }
            let line = line.trim_end();
            if line.is_empty() {
                return Ok(headers);
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_owned(), value.trim().to_owned()));
            }
        }
    }

    /// The next request of a connection; `None` when the client closed it.
    fn read_request(reader: &mut BufReader<TcpStream>) -> anyhow::Result<Option<Request>> {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let mut words = line.split_whitespace();
        let (Some(method), Some(target)) = (words.next(), words.next()) else {
            bail!("a bad request line: {line:?}");
        };
        let (method, raw_target) = (method.to_owned(), target.to_owned());
        let headers = read_headers(reader)?;
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                    .context("a bad chunk size")?;
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(length) = find("content-length") {
            let length: usize = length.parse().context("a bad Content-Length")?;
            body.resize(length, 0);
            reader.read_exact(&mut body)?;
        }
        let (path, query) = raw_target
            .split_once('?')
            .map_or((raw_target.as_str(), ""), |(p, q)| (p, q));
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        Ok(Some(Request {
            method,
            path: path.to_owned(),
            query,
            raw_target: raw_target.clone(),
            headers,
            body,
        }))
    }

    fn write_response(stream: &mut TcpStream, response: &Response) -> std::io::Result<()> {
        let length = response
            .head_length
            .clone()
            .unwrap_or_else(|| response.body.len().to_string());
        let mut head = format!(
            "HTTP/1.1 {} gateway\r\nContent-Length: {length}\r\n",
            response.status
        );
        for (name, value) in &response.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(&response.body)?;
        stream.flush()
    }

    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Percent-decodes `s` (`+` is left as it is: the XML API's keys are
    /// path segments).
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%'
                && let Some(byte) = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(byte);
                i += 3;
                continue;
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Percent-encodes everything but unreserved characters.
    fn encode(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    fn escape(s: &str) -> String {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    }
}
