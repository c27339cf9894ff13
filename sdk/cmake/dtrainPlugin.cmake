# dtrain_add_plugin(NAME SOURCES src... [LIBS lib...]) for out-of-tree
# plugins: a module named dtrain_NAME.so, hidden visibility (only the entry
# symbol is exported), no undefined symbols, linked against the SDK headers.
function(dtrain_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} MODULE ${P_SOURCES})
  set_target_properties(${name} PROPERTIES OUTPUT_NAME "dtrain_${name}" PREFIX ""
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden)
  target_link_libraries(${name} PRIVATE dtrain::sdk ${P_LIBS})
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
endfunction()
