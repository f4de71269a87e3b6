//! [`ErrorsTo`]: the deliveries of a stream of results, its errors handed to a callback.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;

use crate::error::KinesisError;

pin_project! {
    /// The stream of [`errors_to`](super::DeliveryStreamExt::errors_to).
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct ErrorsTo<S, F> {
        #[pin]
        stream: S,
        on_error: F,
    }
}

impl<S, F> ErrorsTo<S, F> {
    pub(super) fn new(stream: S, on_error: F) -> Self {
        Self { stream, on_error }
    }
}

impl<S, D, F> Stream for ErrorsTo<S, F>
where
    S: Stream<Item = Result<D, KinesisError>>,
    F: FnMut(KinesisError),
{
    type Item = D;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<D>> {
        let mut this = self.project();
        loop {
            match futures::ready!(this.stream.as_mut().poll_next(cx)) {
                Some(Ok(delivery)) => return Poll::Ready(Some(delivery)),
                Some(Err(error)) => (this.on_error)(error),
                None => return Poll::Ready(None),
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, self.stream.size_hint().1)
    }
}
