#pragma once
#include "netlink_shims.h"
