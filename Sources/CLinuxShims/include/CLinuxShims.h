#pragma once
#include "load_shims.h"
