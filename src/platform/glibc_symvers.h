/* Included first in every C and C++ file of the build (meson.build, -include)
 * configured with -Dglibc_compat=true where the glibc built against is 2.34
 * or later (not by default: meson.build says what it costs). Binds the glibc
 * functions mnemosyne calls that glibc 2.32 and 2.34 gave new versions
 * (moved from libdl and libpthread into libc, or changed) to their first
 * versions, which every glibc from 2.2.5 on exports. So a library built on
 * Debian 12 or Ubuntu 24.04 loads on glibc 2.31 (Debian 11, Ubuntu 20.04)
 * too, instead of stopping with "version GLIBC_2.34 not found"; the newer
 * glibc exports both versions of each as the same function. Such a build
 * also needs libdl.so.2 and libpthread.so.0 by name, where an old glibc
 * keeps them (on a new one they are empty). Test: cli-library fails naming
 * any function such a library needs at a version newer than 2.31; add it
 * here.
 *
 * Written by hand: a mapping from function to the version a linker should
 * bind, which no library provides. x86-64 only (2.2.5 is its first version);
 * other architectures build without it. */
#ifndef MNEMOSYNE_GLIBC_SYMVERS_H
#define MNEMOSYNE_GLIBC_SYMVERS_H

#include <features.h>

#if defined(__x86_64__) && defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
#define MNEMOSYNE_OLDEST_GLIBC_(fn) __asm__(".symver " #fn "," #fn "@GLIBC_2.2.5");
MNEMOSYNE_OLDEST_GLIBC_(dlopen)
MNEMOSYNE_OLDEST_GLIBC_(dlsym)
MNEMOSYNE_OLDEST_GLIBC_(dlclose)
MNEMOSYNE_OLDEST_GLIBC_(dlerror)
MNEMOSYNE_OLDEST_GLIBC_(pthread_key_create)
MNEMOSYNE_OLDEST_GLIBC_(pthread_setspecific)
MNEMOSYNE_OLDEST_GLIBC_(pthread_attr_setstacksize)
MNEMOSYNE_OLDEST_GLIBC_(pthread_sigmask)
#undef MNEMOSYNE_OLDEST_GLIBC_
#endif

#endif
