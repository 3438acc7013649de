# Compiler warnings and sanitizers applied to every Leash target.
function(leash_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
  if(LEASH_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

if(LEASH_SANITIZE)
  string(REPLACE "," ";" _leash_sans "${LEASH_SANITIZE}")
  string(REPLACE ";" "," _leash_san_flag "${_leash_sans}")
  message(STATUS "Leash: building with -fsanitize=${_leash_san_flag}")
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_leash_san_flag}> $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer> $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${_leash_san_flag})
endif()
