//! [`FilterOrSkip`] and [`FilterMapOrSkip`]: filtering that settles what it leaves out as
//! skipped.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;

use crate::ack::Delivery;

pin_project! {
    /// The stream of [`filter_or_skip`](super::DeliveryStreamExt::filter_or_skip).
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct FilterOrSkip<S, F> {
        #[pin]
        stream: S,
        keep: F,
    }
}

impl<S, F> FilterOrSkip<S, F> {
    pub(super) fn new(stream: S, keep: F) -> Self {
        Self { stream, keep }
    }
}

impl<S, T, F> Stream for FilterOrSkip<S, F>
where
    S: Stream<Item = Delivery<T>>,
    F: FnMut(&T) -> bool,
{
    type Item = Delivery<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery<T>>> {
        let mut this = self.project();
        loop {
            match futures::ready!(this.stream.as_mut().poll_next(cx)) {
                Some(delivery) if (this.keep)(&delivery) => return Poll::Ready(Some(delivery)),
                Some(delivery) => {
                    delivery.skip();
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, self.stream.size_hint().1)
    }
}

pin_project! {
    /// The stream of [`filter_map_or_skip`](super::DeliveryStreamExt::filter_map_or_skip).
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct FilterMapOrSkip<S, F> {
        #[pin]
        stream: S,
        f: F,
    }
}

impl<S, F> FilterMapOrSkip<S, F> {
    pub(super) fn new(stream: S, f: F) -> Self {
        Self { stream, f }
    }
}

impl<S, T, U, F> Stream for FilterMapOrSkip<S, F>
where
    S: Stream<Item = Delivery<T>>,
    F: FnMut(T) -> Option<U>,
{
    type Item = Delivery<U>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery<U>>> {
        let mut this = self.project();
        loop {
            let Some(delivery) = futures::ready!(this.stream.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let (value, token) = delivery.into_parts();
            match (this.f)(value) {
                Some(value) => return Poll::Ready(Some(Delivery::new(value, token))),
                None => token.skip(),
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, self.stream.size_hint().1)
    }
}
