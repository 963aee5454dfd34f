//! A gRPC unary server for the gRPC benchmark (`bench/grpc.sh`): HTTP/2 with prior knowledge
//! (hyper), answering every call with the request's message and `grpc-status: 0` in the
//! trailers, as a gRPC server ends a unary call. One thread, like the peers' backends.
//!
//! Usage: grpc_echo 127.0.0.1:PORT [127.0.0.1:PORT...]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The reply message, then the trailers.
struct Reply(Option<Bytes>, Option<HeaderMap>);

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.0.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.1.take().map(|t| Ok(Frame::trailers(t))))
    }
}

async fn call(req: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let message = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let mut resp = Response::new(Reply(Some(message), Some(trailers)));
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    Ok(resp)
}

fn main() -> std::io::Result<()> {
    let addrs: Vec<String> = std::env::args().skip(1).collect();
    if addrs.is_empty() {
        eprintln!("usage: grpc_echo 127.0.0.1:PORT [...]");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut tasks = Vec::new();
        for a in addrs {
            let listener = tokio::net::TcpListener::bind(&a).await?;
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else { continue };
                    let _ = tcp.set_nodelay(true);
                    tokio::spawn(async move {
                        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .max_concurrent_streams(1000)
                            .serve_connection(TokioIo::new(tcp), service_fn(call));
                        let _ = conn.await;
                    });
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    })
}
