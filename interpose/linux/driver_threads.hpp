// The threads the driver starts (driver_threads.cpp).
#pragma once

namespace mnemosyne {

// How many of the driver's threads are alive now.
long live_driver_threads() noexcept;

}  // namespace mnemosyne
