// The version `clattn --version` prints. The build may pass its own values (-DCLATTN_VERSION=...,
// -DCLATTN_COMMIT=...); these are the fallbacks.
#pragma once

#ifndef CLATTN_VERSION
#define CLATTN_VERSION "0.3.0"
#endif

#ifndef CLATTN_COMMIT
#define CLATTN_COMMIT "unknown"
#endif
